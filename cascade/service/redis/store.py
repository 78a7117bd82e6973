"""The Redis behind the shared limits (`[gateway.redis]`; docs/scaling.md, "What is global").

Every call is one Lua script: EVALSHA, and EVAL when the server does not know the script yet (a new or restarted
Redis; EVAL also caches it), so that what a call reads and writes is one atomic step among all the gateways, timed by
the server's clock (`TIME`), never by a gateway's. `redis.asyncio` is imported here only, when a URL is set: the
default serve does not need the package.

Nothing waits on Redis for longer than `timeout_s`: one call, connecting and waiting for a pooled connection
included, is bounded by it (the client's own retries and timers are off: one deadline, `_Deadline`). The deadline
does not count the gateway's event loop's lag: an answer Redis sent in time is taken even when the loop, busy with
other requests' CPU work, reads it late (a plain asyncio timeout lost it: every call on a new connection failed while
the loop ran 300 ms of CPU after the send, and 16% of 8 requests' calls with 50 ms of CPU each; none do now; the
numbers are in docs/scaling.md). A hung Redis still fails a call within the timeout plus the loop's lag, and about
MAX_LAG_S past the timeout whatever the lag. A call that fails or times out raises StoreUnavailable, and for the next
RETRY_S seconds calls fail at once without trying, so that a Redis that hangs costs a request at most one timeout per
RETRY_S, not three per request; after that the next call tries again, which is how the store reconnects when Redis is
back. What a failed call means for a request is the caller's to ask: `unavailable(op)`
applies `failure` (open: counted, and the caller goes on with this gateway's own limits; closed: counted and
LimitsUnavailable, a 503). Failures are logged as one WARNING line per LOG_EVERY_S at most (with how many more there
were), and the return once; `cascade_redis_*` in /metrics count them (cascade/service/metrics.py `RedisSeries`).

Calls nobody waits for (a token settle, a place given back, a lease heartbeat) run in the background (`spawn`);
`aclose` lets them finish, bounded, then closes the connections.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cascade.errors import ConfigError, LimitsUnavailable
from cascade.service.metrics import RedisSeries

log = logging.getLogger("cascade.gateway")

RETRY_S = 0.5  # after a failed call, calls fail at once for this long
LOG_EVERY_S = 10.0  # one warning line per this, at most


class ThrottledWarning:
    """A warning line at most once per LOG_EVERY_S; the lines held back in between are counted into the next."""

    __slots__ = ("_logged_at", "_unlogged", "what")

    def __init__(self, what: str = "") -> None:
        self.what = what  # names what was held back: " more failures since the last line"
        self.reset()

    def reset(self) -> None:
        """The next `warn` writes at once."""
        self._logged_at, self._unlogged = -math.inf, 0

    def due(self) -> bool:
        """Whether a line may be written now; if not, one more is counted as held back."""
        if time.monotonic() - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return False
        return True

    def warn(self, message: str, *args: object) -> None:
        """Write `message % args` with the held-back count appended (call after `due`)."""
        more = f" ({self._unlogged} more{self.what} since the last line)" if self._unlogged else ""
        log.warning(message + "%s", *args, more)
        self._logged_at, self._unlogged = time.monotonic(), 0
POOL_SIZE = 64  # connections per gateway process; a call holds one for well under a millisecond
LAG_TOLERANCE_S = 0.01  # a call's timer firing later than this: the event loop was busy, and the call waits longer
MAX_LAG_S = 2.0  # what a busy loop's lag adds to a call's timeout, at most
_PING = "return 1"


class StoreUnavailable(Exception):
    """Redis did not answer a call within the timeout (or refused it). `tried` is False when the store failed the call
    without sending it (within RETRY_S of a failure, or closed): Redis certainly did not run it. A call that was tried
    may have run all the same (a hung Redis runs what it received when it resumes)."""

    def __init__(self, message: str, *, tried: bool = True) -> None:
        super().__init__(message)
        self.tried = tried


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
            raise ConfigError("`gateway.redis.url` is set but the `redis` package is not installed: "
                              "pip install 'cascade-gateway[redis]'") from None
        from redis.asyncio.connection import parse_url

        try:
            parse_url(url)
        except ValueError as exc:  # the message names the part, never the password
            raise ConfigError(f"`gateway.redis.url`: {exc}") from None
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
        self._failures = ThrottledWarning(" failures")
        self._pending: set[asyncio.Task[None]] = set()
        self._ping = lua(_PING)
        self.closed = False
        series.up.set(0)

    async def start(self) -> None:
        """Check that Redis answers (logged either way); the gateway starts in any case."""
        if not await self.ping("ping"):
            return
        log.info("shared limits in redis at %s ([gateway.redis] failure = %s)", self.where,
                 "open" if self.fail_open else "closed")

    async def run(self, op: str, script: Script, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        """The script's answer, or StoreUnavailable within `timeout_s`."""
        if self.closed:
            raise StoreUnavailable("the store is closed", tried=False)
        if time.monotonic() < self._retry_at:
            raise StoreUnavailable("redis failed a moment ago", tried=False)
        try:
            result = await self._timed(script, keys, args)
        except self._errors as exc:
            self._failed(op, exc)
            raise StoreUnavailable(str(exc)) from None
        if not self._up:
            self._recovered()
        return result

    async def ping(self, op: str) -> bool:
        """Whether Redis answers now (a failure is counted as `op`'s)."""
        try:
            await self.run(op, self._ping, [], [])
        except StoreUnavailable:
            return False
        return True

    def unavailable(self, op: str) -> None:
        """`op` of a request could not reach Redis: count it, and return (open: the caller goes on with this
        gateway's own limits) or raise LimitsUnavailable (closed)."""
        if self.fail_open:
            self.series.fail_open.labels(op).inc()
            return
        self.series.fail_closed.labels(op).inc()
        raise LimitsUnavailable("the gateway cannot reach its shared limits (Redis); retry the request")

    def spawn(self, op: str, script: Script, keys: Sequence[str], args: Sequence[str | int | float],
              failed: Callable[[StoreUnavailable], None] | None = None) -> None:
        """Run a call in the background; a failure is counted and logged, and handed to `failed` (else dropped)."""
        task = asyncio.ensure_future(self._quietly(op, script, keys, args, failed))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for the background calls (each bounded by the timeout)."""
        while self._pending:
            await asyncio.gather(*self._pending)

    async def aclose(self) -> None:
        """Let the background calls finish (bounded), close the connections; later calls fail untried."""
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=2 * self.timeout_s)
            for task in list(self._pending):
                task.cancel()
        self.closed = True
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def _quietly(self, op: str, script: Script, keys: Sequence[str], args: Sequence[str | int | float],
                       failed: Callable[[StoreUnavailable], None] | None) -> None:
        try:
            await self.run(op, script, keys, args)
        except StoreUnavailable as exc:
            if failed is not None:
                failed(exc)

    async def _timed(self, script: Script, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        async with asyncio.timeout(None) as bound:
            deadline = _Deadline(asyncio.get_running_loop(), bound, self.timeout_s)
            try:
                return await self._eval(script, keys, args)
            finally:
                deadline.cancel()

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
                self.url, max_connections=POOL_SIZE, retry=Retry(NoBackoff(), 0), decode_responses=True,
                # No timers of the client's own: each would fire on a busy loop before the answer is read, and
                # `_timed` bounds the whole call (a cancelled read drops its connection).
                timeout=None, socket_timeout=None, socket_connect_timeout=None)
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
        if not self._failures.due():
            return
        what = (f"no answer within {self.timeout_s:g} s" if isinstance(exc, TimeoutError) and not str(exc)
                else f"{type(exc).__name__}: {exc}")
        then = ("admitting requests on each gateway's own limits ([gateway.redis] failure = open)" if self.fail_open
                else "refusing requests with 503 ([gateway.redis] failure = closed)")
        self._failures.warn("redis at %s: %s failed (%s); %s until it answers", self.where, op, what, then)

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.warning("redis at %s answers again after %.1f s; the limits are shared again", self.where,
                        time.monotonic() - self._down_since)
        self._down_since = None
        self._failures.reset()  # the next failure is logged at once
        self._up = True
        self.series.up.set(1)


class _Deadline:
    """A Redis call's deadline that does not count the gateway loop's lag: the call fails once `timeout_s` has
    passed and the loop is free, so that what Redis sent by then has been read.

    A loop kept busy (other requests' CPU work) past a call's deadline finds, when it runs again, the timer due and
    Redis's answer unread, and a plain timeout fails the call although Redis answered in time. Here a timer that
    fires later than LAG_TOLERANCE_S (the loop was busy) looks again LAG_TOLERANCE_S on, for as long as the loop
    stays busy; once it fires on time, the timeout is scheduled behind the wake-up of what the loop had received,
    two iterations on (asyncio runs a socket's callback before the timers of one iteration, and the wake-up in the
    next). So a call with no answer fails within the timeout plus the loop's lag, and MAX_LAG_S past the timeout
    whatever the lag.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, bound: asyncio.Timeout, after_s: float) -> None:
        self.loop = loop
        self.bound = bound
        self.due = loop.time() + after_s
        self.last = self.due + MAX_LAG_S  # whatever the loop's lag
        self._handle: asyncio.Handle = loop.call_at(self.due, self._fired)

    def cancel(self) -> None:
        self._handle.cancel()

    def _fired(self) -> None:
        now = self.loop.time()
        late = now - self.due
        if late > LAG_TOLERANCE_S and now < self.last:
            self.due = min(now + LAG_TOLERANCE_S, self.last)
            self._handle = self.loop.call_at(self.due, self._fired)
            return
        self._handle = self.loop.call_soon(self._expire)

    def _expire(self) -> None:
        self.bound.reschedule(self.loop.time())  # the timeout, in the next iteration


def where(url: str) -> str:
    """`url` without its password, for logs."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path}"
