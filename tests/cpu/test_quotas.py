"""Per-key quotas without Ray (serve_app/quotas.py): the quota fields of a key entry, the
sliding minute on a fake clock, and an ingress replica's side with a fake ledger (refused
locally while the named wait lasts; a lost ledger admits; a request not scored is given
back)."""

import asyncio

import pytest

from ranker_contract.config import AuthConfig
from serve_app.auth import KeyStore, parse_keys
from serve_app.protocol import ApiError
from serve_app.quotas import NO_QUOTA, Quota, Quotas, QuotaWindows
from tests.support.ledger import FakeLedger

KEY_A, KEY_B = "a" * 15 + "-secret-A", "b" * 15 + "-secret-B"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_key_entry_may_carry_requests_and_tokens_per_minute(monkeypatch):
    keys = parse_keys(f"search:{KEY_A} rpm=600 tpm=2000000\nads {KEY_B} tpm=50\n"
                      "free:" + "c" * 16 + "\n", "src")
    assert keys["search"].quota == Quota(600, 2_000_000)
    assert keys["ads"].quota == Quota(None, 50)
    assert keys["free"].quota == NO_QUOTA and not NO_QUOTA.limited
    monkeypatch.setenv("KEYS", f"search:{KEY_A} rpm=5, ads:{KEY_B}")
    store = KeyStore(AuthConfig(api_keys_env="KEYS"))
    assert store.quota("search") == Quota(5, None) and store.quota("ads") == NO_QUOTA
    assert store.quota("nobody") == NO_QUOTA


@pytest.mark.parametrize("fields", ["rpm=0", "tpm=-3", "rpm=ten", "qps=5", "rpm=5 rpm=6",
                                    KEY_B])
def test_bad_quota_fields_fail_naming_the_entry_never_echoing_them(fields):
    with pytest.raises(ValueError) as error:
        parse_keys(f"search:{KEY_A} {fields}\n", "auth.api_keys_file (keys)")
    message = str(error.value)
    assert "auth.api_keys_file (keys), entry 1 (search)" in message
    assert KEY_A not in message and KEY_B not in message


def test_a_minute_admits_up_to_each_limit_then_names_the_wait():
    clock = Clock(1000.2)
    windows = QuotaWindows(clock)
    quota = Quota(requests_per_minute=3, tokens_per_minute=100)
    assert windows.take("k", quota, 60).wait_s == 0
    clock.now = 1010.5
    assert windows.take("k", quota, 40).wait_s == 0  # 100 tokens: exactly the limit
    refused = windows.take("k", quota, 1)
    # The first request's 60 tokens leave the window 60 s after its second began.
    assert refused.kind == "tokens_per_minute"
    assert refused.wait_s == pytest.approx(1060 - 1010.5)
    assert windows.usage("k", quota)["tokens_per_minute"]["remaining"] == 0
    clock.now = 1060.0  # the first second has left the window
    assert windows.take("k", quota, 50).wait_s == 0
    assert windows.take("k", quota, 5).wait_s == 0
    refused = windows.take("k", quota, 1)  # the tokens fit, a fourth request does not
    assert refused.kind == "requests_per_minute"
    assert refused.wait_s == pytest.approx(1070 - 1060.0)
    usage = windows.usage("k", quota)
    assert usage["requests_per_minute"] == {"limit": 3, "remaining": 0,
                                            "reset_s": pytest.approx(60.0)}
    assert usage["tokens_per_minute"]["remaining"] == 5
    # A refused request is not counted, and another key has its own minute.
    assert windows.take("other", quota, 100).wait_s == 0


def test_a_wait_covers_as_many_old_seconds_as_the_request_needs():
    clock = Clock(0.0)
    windows = QuotaWindows(clock)
    quota = Quota(tokens_per_minute=30)
    for second in (0, 1, 2):
        clock.now = second + 0.5
        assert windows.take("k", quota, 10).wait_s == 0
    clock.now = 10.0
    assert windows.take("k", quota, 25).wait_s == pytest.approx(62 - 10.0)  # 3 seconds' worth
    assert windows.take("k", quota, 5).wait_s == pytest.approx(60 - 10.0)


def test_a_refused_key_is_refused_here_until_its_wait_passes_without_asking_again():
    now = Clock(5000.0)
    ledger = FakeLedger(QuotaWindows(now))
    quotas = Quotas(ledger, clock=now)
    quota = Quota(requests_per_minute=2)
    for _ in range(2):
        asyncio.run(quotas.take("team", quota, 7))
    with pytest.raises(ApiError) as error:
        asyncio.run(quotas.take("team", quota, 7))
    assert error.value.status == 429 and error.value.param == "requests_per_minute"
    assert error.value.headers["Retry-After"] == "60"
    assert error.value.headers["retry-after-ms"] == "60000"
    assert ledger.calls == 3
    now.now += 30
    with pytest.raises(ApiError) as early:
        quotas.refuse_early("team")  # before the body is read: no call to the ledger
    assert early.value.status == 429 and early.value.headers["Retry-After"] == "30"
    quotas.refuse_early("other")  # another key is not refused
    assert ledger.calls == 3
    now.now += 31
    quotas.refuse_early("team")  # the wait has passed
    asyncio.run(quotas.take("team", quota, 7))
    assert ledger.calls == 4


def test_keys_without_a_quota_never_call_the_ledger_and_a_lost_ledger_admits():
    ledger = FakeLedger()
    asyncio.run(Quotas(ledger).take("free", NO_QUOTA, 10**9))
    assert ledger.calls == 0
    lost = FakeLedger(fail=True)
    asyncio.run(Quotas(lost).take("team", Quota(1, 1), 1))  # fails open, logged
    assert lost.calls == 1


def test_a_request_larger_than_its_whole_minute_is_a_413_not_a_retry():
    ledger = FakeLedger()
    with pytest.raises(ApiError) as error:
        asyncio.run(Quotas(ledger).take("team", Quota(tokens_per_minute=100), 101))
    assert error.value.status == 413 and error.value.param == "tokens_per_minute"
    assert "Retry-After" not in (error.value.headers or {})
    assert ledger.calls == 0


def test_a_refund_gives_back_the_request_and_its_tokens_while_their_second_is_in_the_window():
    clock = Clock(2000.5)
    windows = QuotaWindows(clock)
    quota = Quota(requests_per_minute=2, tokens_per_minute=100)
    first = windows.take("k", quota, 70)
    assert first.wait_s == 0 and first.second == 2000
    clock.now = 2001.5
    assert windows.take("k", quota, 30).wait_s == 0
    assert windows.take("k", quota, 1).kind == "requests_per_minute"
    windows.refund("k", quota, 70, first.second)
    usage = windows.usage("k", quota)
    assert usage["requests_per_minute"]["remaining"] == 1
    assert usage["tokens_per_minute"]["remaining"] == 70
    assert windows.take("k", quota, 70).wait_s == 0  # the refunded room is taken again
    # A refund of a second that has left the window, or another key's, changes nothing.
    clock.now = 2060.5  # 2000 has left the window, 2001 has not
    windows.refund("k", quota, 30, 2000)
    windows.refund("other", quota, 30, 2001)
    assert windows.usage("k", quota)["tokens_per_minute"]["remaining"] == 100 - 30 - 70
    # Never more than was counted in that second, never below zero.
    windows.refund("k", quota, 10**6, 2001)
    assert windows.usage("k", quota)["tokens_per_minute"]["remaining"] == 100


def test_an_ingress_replica_sends_a_refund_of_what_it_was_charged_and_a_lost_ledger_keeps_it():
    async def scenario(ledger):
        quotas = Quotas(ledger)
        charge = await quotas.take("team", Quota(tokens_per_minute=50), 40)
        assert charge is not None and charge.tokens == 40
        quotas.refund(charge)
        quotas.refund(None)  # nothing was charged (no quota, or the ledger did not answer)
        for _ in range(500):  # the refund is sent without waiting: wait on its effect
            if ledger.calls == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        return ledger.calls

    ledger = FakeLedger()
    assert asyncio.run(scenario(ledger)) == 2
    assert ledger.windows.usage("team", Quota(tokens_per_minute=50))[
        "tokens_per_minute"]["remaining"] == 50

    class RefundLost(FakeLedger):
        def __init__(self):
            super().__init__()
            self.refund = self._method(self._lost)

        def _lost(self, *args):
            raise ConnectionError("ledger lost")

    lost = RefundLost()
    assert asyncio.run(scenario(lost)) == 2  # logged; the request's failure is not changed
    assert lost.windows.usage("team", Quota(tokens_per_minute=50))[
        "tokens_per_minute"]["remaining"] == 10


def test_a_request_gone_while_the_ledger_counts_it_is_given_back_once_the_ledger_answers():
    # The request's task is cancelled (its client hung up) while the ledger's answer is on its
    # way: the ledger counts it all the same, so the replica gives it back when it answers.
    quota = Quota(requests_per_minute=5, tokens_per_minute=50)

    async def scenario(ledger):
        quotas = Quotas(ledger)
        request = asyncio.ensure_future(quotas.take("team", quota, 40))
        while ledger.calls == 0:
            await asyncio.sleep(0.001)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        for _ in range(500):
            if ledger.calls == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the refund's own delay
        return ledger.calls

    ledger = FakeLedger(delay_s=0.05)
    assert asyncio.run(scenario(ledger)) == 2  # the take, then its refund
    usage = ledger.windows.usage("team", quota)
    assert usage["requests_per_minute"]["remaining"] == 5
    assert usage["tokens_per_minute"]["remaining"] == 50
