"""HTTP ingress: validation, tokenization, multi-item packing and routing. Never imports torch."""
