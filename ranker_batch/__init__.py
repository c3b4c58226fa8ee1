"""Offline scoring of a dataset on Ray Data with the service's own request path and engine
(python -m ranker_batch; docs/OPERATIONS.md, "Batch scoring")."""
