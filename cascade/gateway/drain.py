"""Graceful shutdown (SIGTERM, SIGINT): drain the requests in flight, then end what is left properly.

uvicorn stops by closing its listeners and calling `shutdown()` on every connection; then it waits up
to `timeout_graceful_shutdown` and cancels whatever still runs, which cuts a stream with no event and
answers a request that has no response yet with a plain-text 500. The gateway's connections
(cascade/gateway/connections.py) start a `Drain` at that first `shutdown()` call instead:

1. Every request that arrives from then on gets 503 with `Retry-After`, `connection: close` and
   `x-envoy-immediate-health-check-fail` (Envoy takes the gateway out of its rotation at once, without
   waiting for its next health check), GET /ready included (so that a load balancer stops sending);
   /health and /metrics still answer. A connection closes once its response is complete, except one whose
   response had started before the signal (its headers promised keep-alive): it stays open as in 4.
2. Requests in flight finish, for up to `[gateway] shutdown_grace_s`.
3. When the grace runs out their tasks are cancelled. The cancellation closes their upstream streams
   (the engines stop generating), and the chat handler (cascade/gateway/chat_asgi.py) ends a started
   stream with an OpenAI error event and `data: [DONE]`, and answers any other request with a 503 error
   object.
4. Idle keep-alive connections (a load balancer's pool) stay open until `[gateway] shutdown_linger_s`
   after the signal, or until their clients close them, whichever is first. Closing one under a client
   that is writing a request on it at that moment resets that request before any answer, and a proxy
   cannot tell whether it was served, so it does not retry it (a 503 "connection termination"; the
   scale-out soak in CI once failed one such request outside its kill). Lingering until the load balancer has seen
   /ready fail (or a 503 with the header above), and has closed its connections itself, leaves no such
   moment. A gateway with no open connection (no load balancer, no keep-alive client) does not linger.
5. Then the idle connections left are closed, uvicorn runs the app's shutdown (backends closed, embedded
   workers stopped) and the process exits.

This module knows nothing of uvicorn: the connections hand it the set of request tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cascade.errors import CascadeError
from cascade.service.errors import error_response
from cascade.service.frames import DONE, sse

log = logging.getLogger("cascade.gateway")

# Keys of the ASGI lifespan state under which the app publishes its limits and its Drain for the
# connections (the state is shared by the app's lifespan and the server's protocol instances).
LIMITS_KEY, DRAIN_KEY = "cascade.limits", "cascade.drain"
# Paths that answer as usual while draining (the process is up; its metrics are still worth scraping).
SERVED_WHILE_DRAINING = frozenset({"/health", "/metrics"})
MESSAGE = "the gateway is shutting down; retry the request"
# Envoy's router reads the last header from an upstream and marks that host failed for its active health
# checks at once (with `close_connections_on_host_health_failure`, it then closes its connections to it).
DRAINING_HEADERS = [(b"retry-after", b"1"), (b"connection", b"close"),
                    (b"x-envoy-immediate-health-check-fail", b"true")]
# After the grace: how long the ended requests get to write their last bytes.
_END_S = 2.0
_POLL_S = 0.05


class ShuttingDown(CascadeError):
    """The drain's grace ran out while this request was in flight."""

    def __init__(self) -> None:
        super().__init__(MESSAGE)


def shutdown_error() -> bytes:
    return error_response(MESSAGE, "server_error", None, "shutting_down")


def shutdown_stream_end() -> bytes:
    """The last bytes of a stream the drain ended: an OpenAI error event, then `[DONE]`."""
    return sse(shutdown_error()) + DONE


def longest_drain_s(grace_s: float, linger_s: float) -> float:
    """The longest a drain takes: the grace, the ended requests' last bytes, or the linger, whichever is longer."""
    return max(grace_s + _END_S, linger_s)


class Drain:
    """One gateway's shutdown state; the app reads it, the connections drive it."""

    def __init__(self, grace_s: float = 30.0, linger_s: float = 0.0) -> None:
        self.grace_s = grace_s
        self.linger_s = linger_s
        self.draining = False  # new requests get 503
        self.expired = False  # the grace ran out: the requests still in flight are being ended
        self.done = False  # nothing in flight any more: idle connections may close
        self._task: asyncio.Task[None] | None = None

    def begin(self, requests: set[asyncio.Task[None]], on_done: Callable[[], None],
              open_connections: Callable[[], int]) -> None:
        """Start draining (once): `requests` is the live set of request tasks; `on_done` runs when it
        is empty, or once the requests the grace left over have been ended, and then no connection is
        open any more or `linger_s` has passed since the start."""
        if self.draining:
            return
        self.draining = True
        self._task = asyncio.get_running_loop().create_task(self._run(requests, on_done, open_connections))

    async def _run(self, requests: set[asyncio.Task[None]], on_done: Callable[[], None],
                   open_connections: Callable[[], int]) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        if requests:
            log.info("shutting down: waiting up to %.0f s for %d requests in flight", self.grace_s, len(requests))
        else:  # an idle Ctrl-C: say that nothing is waited for
            log.info("shutting down: no request in flight, stopping now")
        deadline = started + self.grace_s
        while requests and loop.time() < deadline:
            await asyncio.sleep(_POLL_S)
        if requests:
            self.expired = True
            log.warning("shutdown grace of %.0f s ran out: ending %d requests in flight", self.grace_s, len(requests))
            for task in list(requests):
                task.cancel()
            deadline = loop.time() + _END_S
            while requests and loop.time() < deadline:
                await asyncio.sleep(_POLL_S / 5)
        linger_until = started + self.linger_s
        if (left := open_connections()) and loop.time() < linger_until:
            log.info("shutting down: %d idle connections stay open up to %.1f s more, until their clients close them",
                     left, linger_until - loop.time())
        while open_connections() and loop.time() < linger_until:
            await asyncio.sleep(_POLL_S)
        self.done = True
        on_done()
