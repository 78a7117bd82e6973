"""Per-key rate limits: requests and tokens per minute, as token buckets.

`RateLimiter` is the seam: this process's buckets (`LocalRateLimiter`), or buckets in Redis shared by every gateway
(`RedisRateLimiter`, cascade/service/redis/buckets.py, when `[gateway.redis] url` is set). A request `acquire`s 1
request and its estimated tokens at admission, all or nothing (awaited: a shared store answers over the network);
when it ends, `settle` corrects the tokens to what it used (a refund, or a debt that may take the bucket below zero),
in the buckets that admitted it (`Allowance.shared`: Redis's, or this process's when Redis was away and failed open).
`settle` never waits: it runs as a request ends, perhaps cancelled, so a shared store sends it in the background.

Each bucket holds at most a minute's limit and refills continuously at limit/60 per second. The numbers a decision
carries are what OpenAI sends as `x-ratelimit-*` headers: the limit, what remains, and how long until the bucket is
full again ("1s", "6m0s", "250ms").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

LIMITS = ("requests", "tokens")


@dataclass(frozen=True)
class Limit:
    """One bucket's state after a decision; `limit` 0 means unlimited (no headers)."""

    limit: int
    remaining: int
    reset_s: float  # until the bucket is full again
    retry_after_s: float = 0.0  # until the request would fit (refused requests)


@dataclass(frozen=True)
class Allowance:
    """The outcome of `acquire`: `refused` names the limit the request is over ("requests", "tokens") or is None."""

    requests: Limit
    tokens: Limit
    refused: str | None = None
    shared: bool = False  # decided by the buckets in Redis, which its settle must correct; else this process's

    @property
    def retry_after_s(self) -> float:
        return self.requests.retry_after_s if self.refused == "requests" else self.tokens.retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-* headers for the limits that are set."""
        out: list[tuple[bytes, bytes]] = []
        for name, state in (("requests", self.requests), ("tokens", self.tokens)):
            if state.limit:
                out += [(f"x-ratelimit-limit-{name}".encode(), str(state.limit).encode()),
                        (f"x-ratelimit-remaining-{name}".encode(), str(max(0, state.remaining)).encode()),
                        (f"x-ratelimit-reset-{name}".encode(), duration(state.reset_s).encode())]
        return out


class RateLimiter(Protocol):
    async def acquire(self, key: str, rpm: int, tpm: int, tokens: int) -> Allowance:
        """Take 1 request and `tokens` from `key`'s buckets (limits `rpm`, `tpm` per minute; 0: unlimited), or
        nothing if either is short."""
        ...

    def settle(self, key: str, tpm: int, reserved: int, used: int, admitted: Allowance) -> None:
        """Correct `key`'s token bucket, the one that `admitted` the request: it reserved `reserved` tokens and used
        `used` (without waiting)."""
        ...


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, level: float, stamp: float) -> None:
        self.level = level
        self.stamp = stamp


class LocalRateLimiter:
    """Buckets in this process (each `cascade serve --processes` worker has its own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def _bucket(self, key: str, kind: str, limit: int, now: float) -> _Bucket:
        bucket = self._buckets.get((key, kind))
        if bucket is None:
            bucket = self._buckets[(key, kind)] = _Bucket(float(limit), now)
        bucket.level = min(float(limit), bucket.level + (now - bucket.stamp) * limit / 60.0)
        bucket.stamp = now
        return bucket

    async def acquire(self, key: str, rpm: int, tpm: int, tokens: int) -> Allowance:
        return self.take(key, rpm, tpm, tokens)

    def take(self, key: str, rpm: int, tpm: int, tokens: int) -> Allowance:
        """`acquire`, for a caller outside the event loop."""
        now = self.clock()
        req = self._bucket(key, "requests", rpm, now) if rpm else None
        tok = self._bucket(key, "tokens", tpm, now) if tpm else None
        refused = "requests" if req is not None and req.level < 1 else None
        if refused is None and tok is not None and (tok.level < tokens or tokens > tpm):
            refused = "tokens"
        if refused is None:
            if req is not None:
                req.level -= 1
            if tok is not None:
                tok.level -= tokens
        return Allowance(state(None if req is None else req.level, rpm, 1),
                         state(None if tok is None else tok.level, tpm, tokens), refused)

    def settle(self, key: str, tpm: int, reserved: int, used: int, admitted: Allowance | None = None) -> None:
        """`admitted` is not read: these buckets admitted every request settled here."""
        if not tpm or used == reserved:
            return
        bucket = self._bucket(key, "tokens", tpm, self.clock())
        bucket.level = min(float(tpm), bucket.level + reserved - used)


def state(level: float | None, limit: int, need: int) -> Limit:
    """A bucket at `level` (None: no limit) as a decision reports it, for a request that needs `need`."""
    if level is None or not limit:
        return Limit(0, 0, 0.0)
    rate = limit / 60.0
    short = min(need, limit) - level  # a request larger than the limit waits for a full bucket, then fails
    return Limit(limit, math.floor(level), (limit - level) / rate, max(0.0, short / rate))


def duration(seconds: float) -> str:
    """A reset time as OpenAI writes it: "250ms", "1s", "6m0s", "1h2m3s" (whole milliseconds, rounded up)."""
    ms = math.ceil(max(0.0, seconds) * 1000)
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
