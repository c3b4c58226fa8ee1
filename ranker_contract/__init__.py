"""What the ingress and the scorer replicas agree on: the packing contract and the job they
exchange, the errors that cross the Ray boundary, the model-config reader and the settings tree.
No torch and no Ray here: both sides import this package, and it imports neither side."""
