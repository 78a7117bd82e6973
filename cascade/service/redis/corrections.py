"""The corrections Redis did not take: one queue for the keys' token buckets (buckets.py) and budgets (ledger.py).

A request settles in the background when it ends: a correction (a refund or a debt) to what its admission reserved.
When that call fails, what is right depends on whether it reached Redis:

    never sent    the store failing fast after a failure (within RETRY_S): Redis certainly did not apply it, so it is
                  owed, summed per slot, and sent again once Redis answers a ping (every RETRY_S), until its deadline
    sent, no answer  a hung Redis applies what it had received when it resumes, so a retry could apply it twice: it is
                  dropped (at most once, never twice)

A dropped correction is counted (`cascade_redis_settles_dropped_total`) and logged, one line per LOG_EVERY_S at most.
What is still owed when the gateway stops is dropped the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cascade.service.redis.store import RETRY_S, RedisStore, Script, StoreUnavailable, ThrottledWarning

Slot = TypeVar("Slot", bound=Hashable)


@dataclass(frozen=True)
class Owed:
    """One slot's corrections that Redis has not taken yet."""

    keys: Sequence[str]  # the script's KEYS
    args: Callable[[float], Sequence[str | int | float]]  # its ARGV for an amount
    amount: float  # summed: a refund or a debt
    deadline: float  # time.time() after which it is given up


class Corrections(Generic[Slot]):
    def __init__(self, store: RedisStore, op: str, script: Script, expired: str | None,
                 dropped: Callable[[Slot, float, str], str]) -> None:
        """`op`: the store's name for the call; `expired`: why a correction past its deadline is dropped (None: it
        would change nothing, and goes uncounted); `dropped`: the log line for a dropped correction (slot, amount,
        why)."""
        self.store = store
        self.op = op
        self.script = script
        self.expired = expired
        self.dropped = dropped
        self.dropped_count = 0
        self._owed: dict[Slot, Owed] = {}
        self._repaying: asyncio.Task[None] | None = None
        self._drops = ThrottledWarning()

    def send(self, slot: Slot, owed: Owed) -> None:
        """Send `owed` in the background; if Redis does not take it, keep it or drop it as the module says."""
        self.store.spawn(self.op, self.script, owed.keys, owed.args(owed.amount),
                         lambda exc: self._unsettled(slot, owed, exc))

    def owed(self) -> dict[Slot, float]:
        """The corrections waiting for Redis, by slot."""
        return {slot: owed.amount for slot, owed in self._owed.items()}

    def _unsettled(self, slot: Slot, owed: Owed, exc: StoreUnavailable) -> None:
        if exc.tried:
            self._drop(slot, owed,
                       "sent without an answer: Redis may have applied it, and a retry could apply it twice")
            return
        if (earlier := self._owed.get(slot)) is not None:
            owed = Owed(owed.keys, owed.args, earlier.amount + owed.amount, min(earlier.deadline, owed.deadline))
        self._owed[slot] = owed
        if self._repaying is None or self._repaying.done():
            self._repaying = asyncio.ensure_future(self._repay())

    async def _repay(self) -> None:
        while self._owed and not self.store.closed:
            await asyncio.sleep(RETRY_S)
            for slot, owed in list(self._owed.items()):
                if time.time() >= owed.deadline:
                    del self._owed[slot]
                    if self.expired is not None:
                        self._drop(slot, owed, self.expired)
            if not self._owed or not await self.store.ping(self.op):  # a ping first: a lost ping costs nothing
                continue
            for slot in list(self._owed):
                owed = self._owed.pop(slot)
                try:
                    await self.store.run(self.op, self.script, owed.keys, owed.args(owed.amount))
                except StoreUnavailable as exc:
                    self._unsettled(slot, owed, exc)
        for slot in list(self._owed):
            self._drop(slot, self._owed.pop(slot), "the gateway is stopping")

    def _drop(self, slot: Slot, owed: Owed, why: str) -> None:
        self.dropped_count += 1
        self.store.series.settles_dropped.inc()
        if self._drops.due():
            self._drops.warn("%s", self.dropped(slot, owed.amount, why))
