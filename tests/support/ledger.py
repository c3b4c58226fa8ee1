"""A stand-in for the QuotaLedger deployment's handle (serve_app/quota_ledger.py), for CPU tests
of the ingress's quotas without Ray."""

import asyncio

from serve_app.quotas import QuotaWindows


class FakeLedger:
    """QuotaLedger's methods behind a `.remote()` that returns an awaitable, as a handle's."""

    def __init__(self, windows: QuotaWindows | None = None, fail: bool = False,
                 delay_s: float = 0.0) -> None:
        self.windows, self.fail = windows or QuotaWindows(), fail
        self.calls = self.handled = 0  # calls begun; of those, ended (answered or failed)
        self.delay_s = delay_s  # before each call is handled
        self.take = self._method(lambda *a: self.windows.take(*a))
        self.refund = self._method(lambda *a: self.windows.refund(*a))
        self.usage = self._method(lambda *a: self.windows.usage(*a))

    def _method(self, fn):
        ledger = self

        class Method:
            @staticmethod
            def remote(*args):
                async def call():
                    ledger.calls += 1
                    try:
                        await asyncio.sleep(ledger.delay_s)
                        if ledger.fail:
                            raise ConnectionError("ledger lost")
                        return fn(*args)
                    finally:
                        ledger.handled += 1
                return call()
        return Method
