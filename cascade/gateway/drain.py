"""Graceful shutdown (SIGTERM, SIGINT): drain the requests in flight, then end what is left properly.

uvicorn stops by closing its listeners and calling `shutdown()` on every connection; then it waits up
to `timeout_graceful_shutdown` and cancels whatever still runs, which cuts a stream with no event and
answers a request that has no response yet with a plain-text 500. The gateway's connections
(cascade/gateway/connections.py) start a `Drain` at that first `shutdown()` call instead:

1. Every request that arrives from then on gets 503 with `Retry-After` and `connection: close`, GET
   /ready included (so that a load balancer stops sending); /health and /metrics still answer. A
   connection closes once its response is complete.
2. Requests in flight finish, for up to `[gateway] shutdown_grace_s`.
3. When the grace runs out their tasks are cancelled. The cancellation closes their upstream streams
   (the engines stop generating), and the chat handler (cascade/gateway/chat_asgi.py) ends a started
   stream with an OpenAI error event and `data: [DONE]`, and answers any other request with a 503 error
   object.
4. Then the idle connections are closed, uvicorn runs the app's shutdown (backends closed, embedded
   workers stopped) and the process exits.

This module knows nothing of uvicorn: the connections hand it the set of request tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from cascade.errors import CascadeError
from cascade.gateway.errors import error_response
from cascade.gateway.frames import DONE, sse

log = logging.getLogger("cascade.gateway")

# Keys of the ASGI lifespan state under which the app publishes its limits and its Drain for the
# connections (the state is shared by the app's lifespan and the server's protocol instances).
LIMITS_KEY, DRAIN_KEY = "cascade.limits", "cascade.drain"
# Paths that answer as usual while draining (the process is up; its metrics are still worth scraping).
SERVED_WHILE_DRAINING = frozenset({"/health", "/metrics"})
MESSAGE = "the gateway is shutting down; retry the request"
RETRY_AFTER = [(b"retry-after", b"1"), (b"connection", b"close")]
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


class Drain:
    """One gateway's shutdown state; the app reads it, the connections drive it."""

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s
        self.draining = False  # new requests get 503
        self.expired = False  # the grace ran out: the requests still in flight are being ended
        self.done = False  # nothing in flight any more: idle connections may close
        self._task: asyncio.Task[None] | None = None

    def begin(self, requests: set[asyncio.Task[None]], on_done: Callable[[], None]) -> None:
        """Start draining (once): `requests` is the live set of request tasks; `on_done` runs when it
        is empty, or once the requests the grace left over have been ended."""
        if self.draining:
            return
        self.draining = True
        self._task = asyncio.get_running_loop().create_task(self._run(requests, on_done))

    async def _run(self, requests: set[asyncio.Task[None]], on_done: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        if requests:
            log.info("shutting down: waiting up to %.0f s for %d requests in flight", self.grace_s, len(requests))
        deadline = loop.time() + self.grace_s
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
        self.done = True
        on_done()
