"""A tier's branch slots: the branch-aware admission limit.

Every live branch holds one slot of its tier (one sequence in the engine's batch, one share of its
KV cache). A request with N branches waits until N slots are free, so N x requests never exceeds the
tier's budget; each branch gives its slot back the moment it finishes, is pruned or early-stopped,
and the freed slots admit waiting requests (SART's queuing-delay lever). Waiters are served first
come, first served, so a wide request is not starved by a stream of narrow ones.
"""

from __future__ import annotations

import asyncio
import collections

from cascade.errors import Overloaded


class BranchSlots:
    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"slots of `{name}`: capacity must be >= 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self.free = capacity
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, count: int, timeout_s: float | None) -> None:
        """Take `count` slots, waiting at most `timeout_s` (None: no limit), then Overloaded (a 429)."""
        if count > self.capacity:
            raise Overloaded(f"tier `{self.name}` has {self.capacity} branch slots; a request needs {count}")
        if not self._waiters and self.free >= count:
            self.free -= count
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (count, future)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if future.done() and not future.cancelled():
                self.release(count)  # granted just as we gave up: hand the slots on
            else:
                future.cancel()
                self._waiters.remove(entry)
                self._wake()
            if isinstance(exc, TimeoutError):
                raise Overloaded(f"tier `{self.name}`: no {count} free branch slots within {timeout_s} s "
                                 f"({self.capacity} in all, {len(self._waiters)} requests waiting)") from None
            raise

    def release(self, count: int = 1) -> None:
        self.free += count
        assert self.free <= self.capacity, "released more branch slots than were taken"
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            count, future = self._waiters.popleft()
            self.free -= count
            future.set_result(None)
