"""Replicas of one tier behind one Backend: least-outstanding-requests balancing with failover.

A replica that refuses connections is benched for `cooldown_s` and the request is retried on
another replica; that is safe because nothing was generated yet. Faults after the first byte are
not retried: the client may already have seen tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from cascade.branches.backend import Backend, GenerationRequest, GenerationResult, StreamDelta
from cascade.errors import BackendUnavailable


class _Replica:
    __slots__ = ("backend", "benched_until", "outstanding")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.outstanding = 0
        self.benched_until = 0.0


class ReplicaPool:
    def __init__(self, name: str, replicas: Sequence[Backend], cooldown_s: float = 2.0) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        self.name = name
        self.cooldown_s = cooldown_s
        self._replicas = [_Replica(r) for r in replicas]
        self._tiebreak = itertools.count()

    @property
    def outstanding(self) -> int:
        return sum(r.outstanding for r in self._replicas)

    def outstanding_by_replica(self) -> dict[str, int]:
        return {r.backend.name: r.outstanding for r in self._replicas}

    def _order(self) -> list[_Replica]:
        """Healthy replicas by outstanding requests (rotating among ties), then benched ones."""
        now = time.monotonic()
        start = next(self._tiebreak)
        n = len(self._replicas)
        rotated = [self._replicas[(start + i) % n] for i in range(n)]
        return sorted(rotated, key=lambda r: (r.benched_until > now, r.outstanding))

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        last: BackendUnavailable | None = None
        for replica in self._order():
            replica.outstanding += 1
            try:
                return await replica.backend.generate(request)
            except BackendUnavailable as exc:
                replica.benched_until = time.monotonic() + self.cooldown_s
                last = exc
            finally:
                replica.outstanding -= 1
        assert last is not None
        raise last

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamDelta, None]:
        last: BackendUnavailable | None = None
        for replica in self._order():
            replica.outstanding += 1
            started = False
            try:
                async with aclosing(replica.backend.stream(request)) as deltas:
                    async for delta in deltas:
                        started = True
                        yield delta
                return
            except BackendUnavailable as exc:
                if started:
                    raise
                replica.benched_until = time.monotonic() + self.cooldown_s
                last = exc
            finally:
                replica.outstanding -= 1
        assert last is not None
        raise last

    async def health(self) -> bool:
        """Probe every replica at once (SGLang's /health may take seconds); healthy if any is."""
        results = await asyncio.gather(*(r.backend.health() for r in self._replicas))
        for replica, ok in zip(self._replicas, results, strict=True):
            if ok:
                replica.benched_until = 0.0
        return any(results)

    async def aclose(self) -> None:
        for replica in self._replicas:
            await replica.backend.aclose()
