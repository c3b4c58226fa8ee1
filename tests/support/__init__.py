"""Helpers only tests use. What tools also use (starting the service, random models, the
shipped configs) stays in tools/; tests import both."""
