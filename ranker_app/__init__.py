"""The Serve application: builds the ingress and scorer deployments from one AppConfig, checks
config files strictly, and holds the scorer's autoscaling policy."""
