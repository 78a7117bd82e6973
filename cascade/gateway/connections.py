"""Connection-level limits, and the start of the shutdown drain, in uvicorn's httptools protocol.

Why a subclass of uvicorn's `HttpToolsProtocol` (given to uvicorn as `http=`): uvicorn 0.54 has none of
these limits for its httptools parser, the one it picks by default (and the faster one):

- header size: its h11 parser has `h11_max_incomplete_event_size`; httptools has no cap and collects a
  header's bytes in one growing bytes object until it ends. One request with a 200 MB header took the
  gateway's RSS from 67 MB to a peak of 467 MB and 47 s of CPU, then got a 400.
- header and body timeouts: uvicorn's only timer is keep-alive, armed after a response and cancelled
  by any byte; a connection that never completes a request (idle since its accept, one header byte
  every few seconds, a trickled body) was kept for ever.
- open connections: `limit_concurrency` answers 503 only once a request's headers are complete, after
  the connection (a file descriptor) was accepted, and it closes none. 1,100 idle connections took the
  process to its 1,024 open files and every other request failed.

What the subclass does, with `[gateway.limits]`:

- `max_header_bytes`: bytes of a request's line and headers; beyond, 431 and close.
- `header_timeout_s`: a request's line and headers must arrive within this of its first byte (of the
  accept, for a connection's first request); `body_timeout_s`: its body within this of its headers.
  Then 408 and close (a connection that sent nothing is just closed). Every request of a connection
  has them, pipelined ones too: uvicorn queues a request whose headers arrive while an earlier one's
  response is under way and pauses reading until that response ends, so a queued request's clocks
  start when reading resumes for it (its body's when it starts, a head's when reading resumes), not
  never: a POST pipelined behind a `GET /health` with a trickled body was kept for ever.
- `keepalive_timeout_s`: uvicorn's own keep-alive timer, between requests.
- `write_timeout_s`: uvicorn waits for a full send buffer to drain without a bound, so a client that
  never reads its stream held its request place (and its upstream streams) for ever; once writing has
  been paused this long the connection is dropped, and the app sees a disconnect.
- `max_connections` (lowered to half the open-file limit, the other half left for upstream streams and
  files; `cascade serve` raises the soft limit to the hard one first): when full, the connection that has
  waited longest without a request in flight (idle, or still sending its headers) is closed to admit
  the new one, as nginx reuses idle connections, so idle connections never lock clients out; when every
  connection has a request in flight, the new one gets 503 with Retry-After.
- shutdown: uvicorn calls `shutdown()` on every connection when it stops; the first call starts the
  app's Drain (cascade/gateway/drain.py), and connections waiting for a request (or finishing a response
  whose headers promised keep-alive) stay open until it is done, so that a request that arrives on one gets
  a 503 rather than a reset.

Answers are OpenAI error objects with `connection: close`; then the connection discards what the client
still sends for up to a second before it closes, so that the client reads the answer, not a reset. The
limits and the Drain reach the protocol through the ASGI lifespan state, where the app publishes them at
startup: the same in `--processes` mode, whose children build their own app.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from cascade.config import Limits
from cascade.gateway.drain import DRAIN_KEY, LIMITS_KEY, Drain
from cascade.service.errors import error_response

log = logging.getLogger("cascade.gateway")
_SHARED_KEY = "cascade.connections"
LINGER_S = 1.0
# Open files that are neither client nor upstream connections (logs, listeners, the event loop).
_FD_RESERVE = 64


class _Shared:
    """What the connections of one server share."""

    def __init__(self, limits: Limits, drain: Drain | None) -> None:
        self.limits = limits
        self.drain = drain
        self.max_connections = connection_cap(limits.max_connections)
        # Connections without a request in flight, longest waiting first (a dict keeps insertion order).
        self.waiting: dict[GatewayProtocol, None] = {}


def connection_cap(configured: int) -> int:
    """`configured`, or half the open files left after a reserve if that is less."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (soft - _FD_RESERVE) // 2))


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (capped at 2^20); returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # e.g. above the kernel's nr_open
        return soft, soft
    return soft, target


class GatewayProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        shared = app_state.get(_SHARED_KEY)
        if shared is None:
            shared = app_state[_SHARED_KEY] = _Shared(app_state.get(LIMITS_KEY) or Limits(), app_state.get(DRAIN_KEY))
        self.shared: _Shared = shared
        self.timeout_keep_alive = shared.limits.keepalive_timeout_s  # type: ignore[assignment]  # call_later takes float
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # bytes received while a request head was incomplete (what the parser may hold)
        self._in_head = False  # between a request's first byte (after any stray CRLF) and the end of its headers
        self._in_body = False  # between a request's headers and the end of its body
        self._head_too_large = False  # a head parsed within one read was over the limit
        self._answered = False  # this class answered: discard input until the connection closes
        self._write_stall: asyncio.TimerHandle | None = None  # armed while the send buffer is full

    # Connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        shared = self.shared
        if len(self.connections) >= shared.max_connections and not self._evict_one():
            self.transport = transport  # not admitted: never in `connections`
            self._answer(503, "the gateway has too many connections with requests in flight; retry later",
                         "too_many_connections", retry=True)
            return
        super().connection_made(transport)
        shared.waiting[self] = None
        self._arm(shared.limits.header_timeout_s)

    def _evict_one(self) -> bool:
        for victim in self.shared.waiting:  # the longest waiting
            del self.shared.waiting[victim]
            self.connections.discard(victim)  # counted out now: its close completes on the next loop turn
            victim.transport.close()
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.shared.waiting.pop(self, None)
        self._cancel_timer()
        self._stop_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_stall is None:
            self._write_stall = self.loop.call_later(self.shared.limits.write_timeout_s, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_write_timer()

    def _stop_write_timer(self) -> None:
        if self._write_stall is not None:
            self._write_stall.cancel()
            self._write_stall = None

    def _write_stalled(self) -> None:
        self._write_stall = None
        log.info("dropping a connection whose client read nothing for %g s", self.shared.limits.write_timeout_s)
        self.transport.abort()  # connection_lost: the request's task sees http.disconnect

    def shutdown(self) -> None:
        drain = self.shared.drain
        if drain is None or drain.done:
            super().shutdown()  # close if waiting for a request, else close after the response
            return
        drain.begin(self.server_state.tasks, self._drained, lambda: len(self.connections))
        if self.cycle is not None and not self.cycle.response_complete and not self.cycle.response_started:
            self.cycle.keep_alive = False  # its response's headers will say `connection: close`
        # Else waiting for a request, or answering one whose headers went out before the signal and promised
        # keep-alive: closing that connection when its response ends would race a load balancer that reuses it
        # at once (the request it writes would be reset before any answer, which it cannot retry). So it stays
        # open as an idle one: a request that arrives gets a 503 from the app; the drain's end closes it.

    def _drained(self) -> None:
        for connection in list(self.connections):  # every connection of the server, this one or not
            connection.shutdown()

    # Bytes and parser callbacks

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return
        if not self._in_body:
            if self._timer is None:  # a request's first byte after a keep-alive pause
                self._arm(self.shared.limits.header_timeout_s)
            self._head_bytes += len(data)  # reset by on_headers_complete if the head ends in `data`
        super().data_received(data)
        limit = self.shared.limits.max_header_bytes
        too_large = self._head_too_large or (not self._in_body and self._head_bytes > limit)
        if too_large and not self.transport.is_closing():
            self._answer(431, f"request line and headers exceed the limit of {limit} bytes",
                         "request_header_fields_too_large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        # A head that begins in the read that ended the previous request (pipelining) found no timer running. While the
        # gateway has paused reading (a request queued behind a response), the client is not the one waiting: the
        # clock starts when reading resumes (on_response_complete).
        if self._timer is None and not self.flow.read_paused:
            self._arm(self.shared.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._in_head = False
        # A head that arrived within one read was never counted above: measure what was parsed.
        if self._head_too_large or (len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
                                    > self.shared.limits.max_header_bytes):
            self._head_too_large = True  # no ASGI task (nor for requests after it); answered after this read
            return
        self._in_body, self._head_bytes = True, 0
        self.shared.waiting.pop(self, None)
        super().on_headers_complete()
        if self.pipeline:  # queued behind a response in flight (reading paused): its clock starts when it starts
            self._cancel_timer()
        else:
            self._arm(self.shared.limits.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        if not self._head_too_large:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._head_too_large:
            return
        super().on_message_complete()
        self._in_body, self._head_bytes = False, 0
        self._cancel_timer()

    def on_response_complete(self) -> None:
        newest_starts = len(self.pipeline) == 1  # the request started now is the one the parser is in
        super().on_response_complete()  # starts the next queued request, if any, and resumes reading
        if self.transport.is_closing():
            return
        if self.timeout_keep_alive_task is not None:  # no pipelined request started: waiting again
            self.shared.waiting[self] = None
        limits = self.shared.limits
        if self._in_body and newest_starts:  # a pipelined request whose body is still arriving: read from now on
            self._arm(limits.body_timeout_s)
        elif self._in_head and self._timer is None:  # a head begun behind the response: its clock, not keep-alive's
            self._unset_keepalive_if_required()
            self._arm(limits.header_timeout_s)

    # Timers and answers

    def _arm(self, seconds: float) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        limits = self.shared.limits
        if self.transport.is_closing():
            return
        if self._in_body:
            self._answer(408, f"the request body did not arrive within {limits.body_timeout_s:g} s", "request_timeout")
        elif self._in_head or self._head_bytes:
            self._answer(408, f"the request headers did not arrive within {limits.header_timeout_s:g} s",
                         "request_timeout")
        else:
            self.transport.close()  # nothing was sent: nothing to answer

    def _answer(self, status: int, message: str, code: str, retry: bool = False) -> None:
        """Answer `status` with an OpenAI error object and close, unless the app answers or answered this
        request, or another response is under way (then just close). Input is read and discarded for
        LINGER_S meanwhile."""
        self._answered = True
        self._cancel_timer()
        transport = self.transport
        cycle = self.cycle  # in the body: this request's; else the previous request's (or None)
        if cycle is not None and (cycle.response_started if self._in_body else not cycle.response_complete):
            transport.close()
            return
        kind = "server_error" if status >= 500 else "invalid_request_error"
        body = error_response(message, kind, None, code)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % len(body))
        if retry:
            head.append(b"retry-after: 1\r\n")
        transport.write(b"".join(head) + b"\r\n" + body)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        if self.flow is not None:
            self.flow.resume_reading()
        self.loop.call_later(LINGER_S, transport.close)
