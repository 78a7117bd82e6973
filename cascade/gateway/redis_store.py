"""The Redis behind the shared limits (`[gateway] redis_url`; docs/scaling.md, "What is global").

Every call is one Lua script: EVALSHA, and EVAL when the server does not know the script yet (a new or restarted
Redis; EVAL also caches it), so that what a call reads and writes is one atomic step among all the gateways, timed by
the server's clock (`TIME`), never by a gateway's. `redis.asyncio` is imported here only, when a URL is set: the
default serve does not need the package.

Nothing waits on Redis for longer than `redis_timeout_s`: one call, connecting and waiting for a pooled connection
included, is bounded by it (the client's own retries are off). A call that fails or times out raises StoreUnavailable,
and for the next RETRY_S seconds calls fail at once without trying, so that a Redis that hangs costs a request at
most one timeout per RETRY_S, not three per request; after that the next call tries again, which is how the store
reconnects when Redis is back. What a failed call means for a request is the caller's to ask: `unavailable(op)`
applies `redis_failure` (open: counted, and the caller goes on with this gateway's own limits; closed: counted and
LimitsUnavailable, a 503). Failures are logged as one WARNING line per LOG_EVERY_S at most (with how many more there
were), and the return once; `cascade_redis_*` in /metrics count them (cascade/gateway/metrics.py `RedisSeries`).

Calls nobody waits for (a token settle, a place given back, a lease heartbeat) run in the background (`spawn`);
`aclose` lets them finish, bounded, then closes the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cascade.errors import ConfigError, LimitsUnavailable
from cascade.gateway.metrics import RedisSeries

log = logging.getLogger("cascade.gateway")

RETRY_S = 0.5  # after a failed call, calls fail at once for this long
LOG_EVERY_S = 10.0  # one warning line per this, at most
POOL_SIZE = 64  # connections per gateway process; a call holds one for well under a millisecond
_PING = "return 1"


class StoreUnavailable(Exception):
    """Redis did not answer a call within the timeout (or refused it)."""


@dataclass(frozen=True)
class Script:
    source: str
    sha: str


def lua(source: str) -> Script:
    """A Lua script with its SHA1, as EVALSHA names it."""
    return Script(source, hashlib.sha1(source.encode()).hexdigest())


class RedisStore:
    def __init__(self, url: str, series: RedisSeries, *, timeout_s: float = 0.25, failure: str = "open") -> None:
        try:
            from redis.exceptions import NoScriptError, RedisError
        except ImportError:
            raise ConfigError("`gateway.redis_url` is set but the `redis` package is not installed: "
                              "pip install 'cascade-gateway[redis]'") from None
        from redis.asyncio.connection import parse_url

        try:
            parse_url(url)
        except ValueError as exc:  # the message names the part, never the password
            raise ConfigError(f"`gateway.redis_url`: {exc}") from None
        self.url = url
        self.where = where(url)
        self.timeout_s = timeout_s
        self.fail_open = failure == "open"
        self.series = series
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._no_script = NoScriptError
        self._client: Any = None
        self._up = False
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._logged_at = -math.inf
        self._unlogged = 0
        self._pending: set[asyncio.Task[None]] = set()
        self._ping = lua(_PING)
        series.up.set(0)

    async def start(self) -> None:
        """Check that Redis answers (logged either way); the gateway starts in any case."""
        try:
            await self.run("ping", self._ping, [], [])
        except StoreUnavailable:
            return
        log.info("shared limits in redis at %s (redis_failure = %s)", self.where,
                 "open" if self.fail_open else "closed")

    async def run(self, op: str, script: Script, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        """The script's answer, or StoreUnavailable within `timeout_s`."""
        if time.monotonic() < self._retry_at:
            raise StoreUnavailable("redis failed a moment ago")
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await self._eval(script, keys, args)
        except self._errors as exc:
            self._failed(op, exc)
            raise StoreUnavailable(str(exc)) from None
        if not self._up:
            self._recovered()
        return result

    def unavailable(self, op: str) -> None:
        """`op` of a request could not reach Redis: count it, and return (open: the caller goes on with this
        gateway's own limits) or raise LimitsUnavailable (closed)."""
        if self.fail_open:
            self.series.fail_open.labels(op).inc()
            return
        self.series.fail_closed.labels(op).inc()
        raise LimitsUnavailable("the gateway cannot reach its shared limits (Redis); retry the request")

    def spawn(self, op: str, script: Script, keys: Sequence[str], args: Sequence[str | int | float]) -> None:
        """Run a call in the background; a failure is counted and logged, and otherwise dropped."""
        task = asyncio.ensure_future(self._quietly(op, script, keys, args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for the background calls (each bounded by the timeout)."""
        while self._pending:
            await asyncio.gather(*self._pending)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=2 * self.timeout_s)
            for task in list(self._pending):
                task.cancel()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def _quietly(self, op: str, script: Script, keys: Sequence[str], args: Sequence[str | int | float]) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.run(op, script, keys, args)

    async def _eval(self, script: Script, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        client = self._connection()
        try:
            return await client.evalsha(script.sha, len(keys), *keys, *args)
        except self._no_script:  # a new or restarted Redis: EVAL runs it and caches it for the next EVALSHA
            return await client.eval(script.source, len(keys), *keys, *args)

    def _connection(self) -> Any:
        if self._client is None:  # made in the event loop that uses it
            from redis.asyncio import BlockingConnectionPool, Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            pool = BlockingConnectionPool.from_url(
                self.url, max_connections=POOL_SIZE, timeout=self.timeout_s, socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s, retry=Retry(NoBackoff(), 0), decode_responses=True)
            self._client = Redis.from_pool(pool)
        return self._client

    def _failed(self, op: str, exc: BaseException) -> None:
        now = time.monotonic()
        self.series.errors.labels(op).inc()
        self.series.up.set(0)
        self._up = False
        self._retry_at = now + RETRY_S
        if self._down_since is None:
            self._down_since = now
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        what = (f"no answer within {self.timeout_s:g} s" if isinstance(exc, TimeoutError) and not str(exc)
                else f"{type(exc).__name__}: {exc}")
        then = ("admitting requests on each gateway's own limits (redis_failure = open)" if self.fail_open
                else "refusing requests with 503 (redis_failure = closed)")
        more = f" ({self._unlogged} more failures since the last line)" if self._unlogged else ""
        log.warning("redis at %s: %s failed (%s); %s until it answers%s", self.where, op, what, then, more)
        self._logged_at, self._unlogged = now, 0

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.warning("redis at %s answers again after %.1f s; the limits are shared again", self.where,
                        time.monotonic() - self._down_since)
        self._down_since = None
        self._logged_at, self._unlogged = -math.inf, 0  # the next failure is logged at once
        self._up = True
        self.series.up.set(1)


def where(url: str) -> str:
    """`url` without its password, for logs."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path}"
