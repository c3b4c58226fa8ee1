"""The ingress's deadline follows Serve's rule for `x-request-timeout-seconds` and answers before
Serve would (serve_app/deadline.py)."""

import pytest

from serve_app.deadline import answer_by_s, request_timeout_s


@pytest.mark.parametrize("header, default_s, expected", [
    (None, 60.0, 60.0),  # no header: the config's request_timeout_s
    (None, None, None),  # neither: none
    ("300", 60.0, 300.0),  # a longer one asked for
    ("0.5", 60.0, 0.5),
    ("0", 60.0, None),  # 0 or less: none
    ("-1", 60.0, None),
    ("soon", 60.0, 60.0),  # not a number: the default, as Serve reads it
])
def test_the_deadline_of_a_request(header, default_s, expected):
    assert request_timeout_s(header, default_s) == expected


def test_the_ingress_answers_before_serve():
    assert answer_by_s(60.0) == pytest.approx(59.0)  # a second early
    assert answer_by_s(0.5) == pytest.approx(0.45)  # a tenth early, for a short deadline
    assert 0 < answer_by_s(0.01) < 0.01
