"""Replicas of one tier behind one Backend: least-outstanding-requests balancing (or choice by prefix), failover,
and a circuit breaker per replica.

Choice (`[tiers.replicas]`, cascade/config/replicas.py): by default the eligible replica with the fewest requests in
flight; with `choice = "prefix"`, the first eligible replica on a hash ring from the request's affinity key whose
load stays within the bound (consistent hashing with bounded loads: cascade/branches/affinity.py), so a
conversation keeps meeting its engine's prefix cache. Either way benched, down and already tried replicas are never
chosen, so breakers, health and failover work alike: a failed attempt's retry goes to the next replica on the ring.

Failover: a fault before a replica sent its first delta is retried on another replica (`retries`
more attempts, each on a replica not tried yet), which is safe because nothing was generated yet.
`generate` collects a whole answer before anything reaches the client, so it also retries a fault
that came mid-answer. A stream that already yielded deltas is never retried: its consumer may have
sent them on.

Circuit breaker: `breaker_failures` consecutive faults (or one refused connection) bench a replica
for `breaker_open_s`; then it is half-open, and one request probes it: success closes the breaker, failure
benches it again for twice as long (up to `breaker_max_open_s`). A benched replica gets no traffic.
When every replica is benched, each may still be probed once per `breaker_open_s` (Envoy's "panic"
idea, bounded): replicas that failed at different times must not keep a tier down for their doubled
benches after they recovered. Other requests fail at once (BackendUnavailable with the time to the
next probe) instead of queueing on dead engines. A health check that passes ends a bench caused by
a refused connection (the engine restarted) early.

Engine health (`watch_health`, in the gateway): each replica may read its engine's background health poller
(cascade/branches/health_poller.py). A replica its poller sees down is passed over like a benched one, and is
not probed with a client's request either, since its poller probes it: when every replica is benched or down, the
benched ones are probed as above, and a tier whose replicas are all down fails at once with BackendUnavailable
(route mode then falls back to another tier) instead of waiting out a timeout on a stalled engine. A replica
with no poller, or one without a verdict yet, is judged by its breaker alone.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Literal

import msgspec

from cascade.branches.affinity import Ring, affinity_point, bounded_choice
from cascade.branches.backend import Backend, GenerationRequest, GenerationResult, StreamDelta, collect, incomplete
from cascade.branches.health_poller import HealthPoller, HealthState
from cascade.config import FailoverConfig, ReplicasConfig
from cascade.errors import BackendError, BackendUnavailable, CascadeError, Overloaded

BreakerState = Literal["closed", "open", "half_open"]
_STATE_CODE: dict[BreakerState, int] = {"closed": 0, "half_open": 1, "open": 2}


class ReplicaState(msgspec.Struct, frozen=True, kw_only=True):
    """One replica as /ready and /metrics show it."""

    name: str
    state: BreakerState
    outstanding: int
    consecutive_failures: int
    opened: int  # times its breaker opened
    next_probe_s: float | None  # seconds until it may be probed (open only)
    health: HealthState = "unknown"  # its engine's background health checks ("unknown": none, or no verdict yet)
    health_error: str = ""  # why its engine's last health check failed

    @property
    def state_code(self) -> int:
        return _STATE_CODE[self.state]


class _Replica:
    __slots__ = ("attempted_at", "backend", "bench_s", "failures", "health", "opened", "opened_until", "outstanding",
                 "passes_at_bench", "probing", "refused", "tripped")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.outstanding = 0
        self.failures = 0  # consecutive
        self.tripped = False  # the breaker is open or half-open
        self.opened_until = 0.0
        self.bench_s = 0.0
        self.probing = False  # a half-open probe is in flight
        self.refused = False  # the breaker opened on a refused connection
        self.opened = 0
        self.attempted_at = 0.0  # when a request was last sent to it
        self.health: HealthPoller | None = None  # its engine's background health checks (the gateway's)
        self.passes_at_bench = 0  # the health poller's passes when the breaker last opened

    def state(self, now: float) -> BreakerState:
        if not self.tripped:
            return "closed"
        return "open" if now < self.opened_until and not self._restarted() else "half_open"

    def _restarted(self) -> bool:
        """Benched for a refused connection, and its engine has passed a health check since: the engine came back
        (restarted), so the bench ends early and the next request probes it."""
        return self.refused and self.health is not None and self.health.passes > self.passes_at_bench

    def down(self) -> bool:
        """Its engine's recent health checks failed (no poller, or no verdict yet: not down)."""
        return self.health is not None and self.health.down()

    def eligible(self, now: float) -> bool:
        state = self.state(now)
        return not self.down() and (state == "closed" or (state == "half_open" and not self.probing))


class ReplicaPool:
    def __init__(self, name: str, replicas: Sequence[Backend], failover: FailoverConfig | None = None,
                 choice: ReplicasConfig | None = None, ring_ids: Sequence[str] | None = None) -> None:
        """`choice`: how a request picks a replica (None: least outstanding); `ring_ids`: the replicas' names on the
        hash ring of choice by prefix, the same in every gateway (their URLs; None: the backends' names)."""
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        if ring_ids is not None and len(ring_ids) != len(replicas):
            raise ValueError(f"pool `{name}` has {len(replicas)} replicas, got {len(ring_ids)} ring ids")
        self.name = name
        self.failover = failover or FailoverConfig()
        self.choice = choice or ReplicasConfig()
        self._replicas = [_Replica(r) for r in replicas]
        self._index = {id(r): i for i, r in enumerate(self._replicas)}
        self._ring = Ring(ring_ids or [r.name for r in replicas]) if self.choice.choice == "prefix" else None
        self._tiebreak = itertools.count()
        self.retried = 0  # attempts made after a fault, on another replica (failovers)
        self.spilled = 0  # requests by prefix sent past their replica on the ring, which was over its load bound
        self.prompt_tokens = 0  # prompt tokens the engines reported, every attempt and branch
        self.cached_prompt_tokens = 0  # ... of which their prefix caches served (engines that report it)

    @property
    def outstanding(self) -> int:
        return sum(r.outstanding for r in self._replicas)

    @property
    def backends(self) -> list[Backend]:
        """The replicas' backends, in order."""
        return [r.backend for r in self._replicas]

    def watch_health(self, pollers: Sequence[HealthPoller | None]) -> None:
        """Read each replica's engine health from these background pollers (one per replica, in order; None: none)."""
        if len(pollers) != len(self._replicas):
            raise ValueError(f"pool `{self.name}` has {len(self._replicas)} replicas, got {len(pollers)} pollers")
        for replica, poller in zip(self._replicas, pollers, strict=True):
            replica.health = poller

    def available(self) -> bool:
        """Whether a request could be sent now (some replica is neither benched nor down)."""
        now = time.monotonic()
        return any(r.eligible(now) for r in self._replicas)

    def serving(self) -> bool:
        """Whether the tier can serve (/ready): some replica is neither benched (open) nor seen down by its health
        checks. Unlike `available`, a half-open replica that a request is probing now counts."""
        now = time.monotonic()
        return any(r.state(now) != "open" and not r.down() for r in self._replicas)

    def states(self) -> list[ReplicaState]:
        now = time.monotonic()
        return [ReplicaState(name=r.backend.name, state=r.state(now), outstanding=r.outstanding,
                             consecutive_failures=r.failures, opened=r.opened,
                             next_probe_s=round(r.opened_until - now, 3) if r.state(now) == "open" else None,
                             health=r.health.state() if r.health is not None else "unknown",
                             health_error=r.health.error if r.health is not None and r.down() else "")
                for r in self._replicas]

    # --- choosing and judging replicas ---------------------------------------------------------

    def _pick(self, tried: set[int], request: GenerationRequest | None = None) -> _Replica:
        """The eligible replica not tried yet with the fewest outstanding requests (ties rotate), or, choosing by
        prefix, the request's on the ring within the load bound."""
        now = time.monotonic()
        start = next(self._tiebreak)
        n = len(self._replicas)
        candidates = [self._replicas[(start + i) % n] for i in range(n)]
        untried = [r for r in candidates if id(r) not in tried]
        eligible = [r for r in untried if r.eligible(now)]
        if eligible:
            if self._ring is not None and request is not None:
                replica = self._by_prefix(request, eligible)
            else:
                replica = min(eligible, key=lambda r: r.outstanding)
            replica.probing = replica.state(now) == "half_open"
        else:  # every replica is benched or down: probe a benched one that was not tried for breaker_open_s
            due = [r for r in untried if not r.probing and not r.down()
                   and now - r.attempted_at >= self.failover.breaker_open_s]
            if not due:
                raise self._all_benched(now)
            replica = min(due, key=lambda r: r.opened_until)
            replica.probing = True
        replica.attempted_at = now
        return replica

    def _by_prefix(self, request: GenerationRequest, eligible: list[_Replica]) -> _Replica:
        assert self._ring is not None
        choice = self.choice
        loads = {self._index[id(r)]: r.outstanding for r in eligible}
        point = affinity_point(request, choice.prefix_messages, choice.prefix_chars)
        index, spilled = bounded_choice(self._ring.walk(point), loads, choice.load_factor)
        self.spilled += spilled
        return self._replicas[index]

    def _usage(self, delta: StreamDelta) -> None:
        self.prompt_tokens += delta.prompt_tokens or 0
        self.cached_prompt_tokens += delta.cached_tokens or 0

    def _all_benched(self, now: float) -> BackendUnavailable:
        down = [r for r in self._replicas if r.down()]
        if len(down) == len(self._replicas):  # nothing to probe: the health checks say when it is back
            assert down[0].health is not None
            retry_after = max(1.0, down[0].health.config.interval_s)
            return BackendUnavailable(
                f"tier `{self.name}`: no replica can take the request (every replica's engine fails its health "
                f"checks: {down[0].health.error})", self.name, retry_after_s=retry_after)
        waits = [r.opened_until - now for r in self._replicas if r.state(now) == "open" and not r.down()]
        retry_after = max(1.0, min(waits)) if waits else 1.0
        return BackendUnavailable(
            f"tier `{self.name}`: no replica can take the request (every replica is benched after repeated "
            f"faults, being probed or failing its health checks; next probe in {retry_after:.0f} s)", self.name,
            retry_after_s=retry_after)

    def _succeeded(self, replica: _Replica) -> None:
        replica.failures = 0
        replica.tripped = replica.probing = replica.refused = False
        replica.bench_s = 0.0

    def _failed(self, replica: _Replica, exc: CascadeError) -> None:
        replica.probing = False
        if not isinstance(exc, BackendError):
            return  # the engine is alive and said no (overloaded): not a fault of the replica
        replica.failures += 1
        settings = self.failover
        refused = isinstance(exc, BackendUnavailable)
        if replica.tripped:  # a failed half-open probe: bench it again, for longer
            replica.bench_s = min(replica.bench_s * 2, settings.breaker_max_open_s)
        elif refused or replica.failures >= settings.breaker_failures:
            replica.bench_s = settings.breaker_open_s
        else:
            return
        replica.tripped, replica.refused = True, refused
        replica.passes_at_bench = replica.health.passes if replica.health is not None else 0
        replica.opened += 1
        replica.opened_until = time.monotonic() + replica.bench_s

    def _released(self, replica: _Replica) -> None:
        """The attempt ended without a verdict (the consumer closed the stream early)."""
        replica.probing = False

    def _attempts(self) -> int:
        return 1 + max(0, min(self.failover.retries, len(self._replicas) - 1))

    def _start(self, attempt: int, tried: set[int], last: CascadeError | None,
               request: GenerationRequest | None = None) -> _Replica:
        """The replica for this attempt, counted as outstanding; when none is left, the last fault (or,
        on the first attempt, BackendUnavailable)."""
        try:
            replica = self._pick(tried, request)
        except BackendUnavailable:
            if last is not None:
                raise last from None
            raise
        tried.add(id(replica))
        if attempt:
            self.retried += 1
        replica.outstanding += 1
        return replica

    # --- the Backend protocol ------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """The whole answer, streamed from a replica; any fault, even mid-answer, is retried on another
        replica (nothing has reached the client yet). `retries` on the result counts the failovers."""
        async with aclosing(self._failover(request, whole=True)) as deltas:
            return await collect(deltas)

    def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamDelta, None]:
        return self._failover(request, whole=False)  # the loop itself: no extra hop per delta on the hot path

    async def _failover(self, request: GenerationRequest, whole: bool) -> AsyncGenerator[StreamDelta, None]:
        """The one failover loop. Each attempt's deltas pass on as they come, and a fault once one has passed
        is not retried; `whole`: an attempt's deltas are held until it has answered (a stream that ends without
        a finish reason is a fault), so a fault anywhere is retried. The first delta carries `retries`."""
        tried: set[int] = set()
        last: CascadeError | None = None
        lost = 0  # tokens decoded by failed whole attempts
        for attempt in range(self._attempts()):
            replica = self._start(attempt, tried, last, request)
            held: list[StreamDelta] = []
            started = False
            try:
                async with aclosing(replica.backend.stream(request)) as deltas:
                    async for delta in deltas:
                        if delta.prompt_tokens is not None:
                            self._usage(delta)
                        if not (started or held):
                            delta.retries, delta.retried_tokens = attempt, lost
                        if whole:
                            held.append(delta)
                            continue
                        started = True
                        yield delta
                if whole and all(d.finish_reason is None for d in held):
                    raise incomplete()
            except (BackendError, Overloaded) as exc:
                self._failed(replica, exc)
                if started:
                    raise
                lost += decoded(held)
                last = exc
                continue
            except BaseException:
                self._released(replica)
                raise
            finally:
                replica.outstanding -= 1
            self._succeeded(replica)
            for delta in held:
                yield delta
            return
        assert last is not None
        raise last

    async def health(self) -> bool:
        """Probe every replica at once, live (SGLang's /health may take seconds); healthy if one answers and
        is not benched. A passing probe ends a bench caused by a refused connection (engine restarted). The gateway
        never waits on this: it reads its background health pollers (`watch_health`, `serving`)."""
        results = await asyncio.gather(*(r.backend.health() for r in self._replicas), return_exceptions=True)
        now = time.monotonic()
        healthy = False
        for replica, ok in zip(self._replicas, results, strict=True):
            if ok is not True:
                continue
            if replica.refused and replica.state(now) == "open":
                replica.opened_until = now  # half-open: the next request probes it
            healthy = healthy or replica.state(now) != "open"
        return healthy

    async def aclose(self) -> None:
        for replica in self._replicas:
            await replica.backend.aclose()


def decoded(deltas: list[StreamDelta]) -> int:
    """Tokens an attempt's deltas carried: the engine's own count where it reported one, else one per text chunk."""
    counted = [d.completion_tokens for d in deltas if d.completion_tokens is not None]
    return counted[-1] if counted else sum(d.chunks for d in deltas if d.text or d.reasoning or d.tool_calls)
