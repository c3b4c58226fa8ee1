"""Scorer replicas: model loading, the prefill-only forward, the scheduling loop, the deployment."""
