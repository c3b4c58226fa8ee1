"""Which LoRA adapters a scorer's GPU holds, and loading the others on first use: the engine
has a fixed number of adapter slots (gpu_worker/model/lora.py, LoraLinear); a request may name any
adapter of the configuration. Driven by the scheduling loop (gpu_worker/serving/scheduler.py), whose
thread alone calls these methods; like it, this module imports no torch.

An adapter's tasks wait in the queue, skipped, until it is in a slot. Its read (disk to host
memory, the slow part) runs on a thread of its own, so batches of other adapters keep running;
the loop then writes it into the slot between two launches, queued on the device after every
batch launched before. The slot is a free one, else that of the least recently used adapter
with no task queued or running: an adapter in use is never unloaded, so while every slot is in
use a new adapter's tasks wait (and `max_queue_wait_s` bounds that wait).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)


class AdapterSlots:
    """Adapters are numbered as a request names them (1, 2, ...: the configuration's order; 0
    the model itself); slots as the engine numbers them (1 up to its slot count)."""

    def __init__(self, adapters: int, slots: int, resident: dict[int, int],
                 read: Callable[[int], Any], put: Callable[[int, Any], None]) -> None:
        """`adapters`: how many there are; `resident`: adapter -> slot, already loaded.
        `read(adapter)`: the adapter in host memory, on the reading thread; `put(slot, read)`:
        into the engine, on the loop's."""
        self.slot_of = dict(resident)
        self._free = sorted(set(range(1, slots + 1)) - set(resident.values()))
        self._read, self._put = read, put
        self.users: collections.Counter[int] = collections.Counter()  # tasks queued or running
        self._last_used: dict[int, int] = dict.fromkeys(resident, 0)
        self._turn = 0
        self._reading: dict[int, tuple[int, concurrent.futures.Future]] = {}  # adapter -> slot
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "adapter-read")
        self.on_read_done: Callable[[], None] = lambda: None  # wakes the loop
        # per adapter (index 0 unused): times loaded on first use, and unloaded; fixed lists, so
        # that the metrics thread may copy them while this one counts
        self.loads = [0] * (adapters + 1)
        self.unloads = [0] * (adapters + 1)

    def ready(self, adapter: int) -> bool:
        return adapter == 0 or adapter in self.slot_of

    def slot(self, adapter: int) -> int:
        return 0 if adapter == 0 else self.slot_of[adapter]

    def used(self, adapters: Iterable[int]) -> None:
        """A batch of these adapters is launched: they are the most recently used."""
        self._turn += 1
        for adapter in adapters:
            if adapter:
                self._last_used[adapter] = self._turn

    def step(self) -> dict[int, BaseException]:
        """Put every finished read into its slot, and start reading the adapters tasks wait
        for, each where a slot can be had. Returns the adapters whose read failed, with why:
        their waiting tasks must fail (a later task tries again)."""
        failed = {}
        for adapter, (slot, read) in list(self._reading.items()):
            if not read.done():
                continue
            del self._reading[adapter]
            try:
                self._put(slot, read.result())
            except Exception as exc:  # noqa: BLE001 - the adapter's tasks fail, not the loop
                logger.exception("loading adapter %d into slot %d failed", adapter, slot)
                self._free.append(slot)
                failed[adapter] = exc
                continue
            self.slot_of[adapter] = slot
            self._last_used[adapter] = self._turn
            self.loads[adapter] += 1
        for adapter, count in self.users.items():
            if (count and adapter not in self.slot_of and adapter not in self._reading
                    and adapter not in failed):  # failed: its waiting tasks fail first
                slot = self._take_slot()
                if slot is None:
                    break  # every slot is in use: wait for one to go idle
                future = self._reader.submit(self._read, adapter)
                future.add_done_callback(lambda _: self.on_read_done())
                self._reading[adapter] = (slot, future)
        return failed

    def _take_slot(self) -> int | None:
        if self._free:
            return self._free.pop(0)
        idle = [a for a in self.slot_of if not self.users[a]]
        if not idle:
            return None
        victim = min(idle, key=self._last_used.__getitem__)
        self.unloads[victim] += 1
        logger.info("unloading adapter %d (least recently used) from slot %d", victim,
                    self.slot_of[victim])
        return self.slot_of.pop(victim)
