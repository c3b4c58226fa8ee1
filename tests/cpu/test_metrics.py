"""The label values declared at 0 at start-up cover every value the replicas emit
(tools/check_dashboard.py, via tests/cpu/test_dashboard.py, checks them in Prometheus)."""

import ast
from pathlib import Path

from gpu_worker.serving.metrics import BATCH_ERROR_TYPES, batch_error_type
from serve_app.metrics import CANCELLED_STATUS, CANCELLED_TYPE, ERRORS
from serve_app.protocol import ApiError

SERVE_APP = Path(__file__).resolve().parents[2] / "serve_app"


def _raised_statuses() -> set[int]:
    """Every literal status an ApiError is built with in the ingress package."""
    found = set()
    for path in SERVE_APP.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ApiError"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(node.args[0].value)
    return found


def test_every_error_status_the_ingress_raises_is_declared():
    statuses = _raised_statuses()
    assert {400, 413, 503} <= statuses  # the scan finds them
    declared = dict(ERRORS)
    assert {str(s) for s in statuses} <= set(declared)
    # a 408 is counted as a cancellation, whoever answered it (serve_app/metrics.py)
    assert all(declared[str(s)] == (CANCELLED_TYPE if s == CANCELLED_STATUS
                                    else ApiError(s, "").kind) for s in statuses)
    assert CANCELLED_STATUS in statuses  # the ingress's own deadline
    assert declared[str(CANCELLED_STATUS)] == "Cancelled" and CANCELLED_STATUS == 408


def test_batch_errors_map_onto_the_declared_types():
    assert batch_error_type("OutOfMemoryError") == "OutOfMemoryError"
    assert batch_error_type("RuntimeError") == "RuntimeError"
    assert batch_error_type("ZeroDivisionError") == "other"
    assert {batch_error_type(name) for name in ("KeyError", "IndexError")} <= set(
        BATCH_ERROR_TYPES)
