"""One HTTP/1.1 client connection as an asyncio Protocol around httptools (uvicorn's parser), for
cascade/branches/http_stream.py's pool: it serves one request at a time and hands body bytes to the
reader as they arrive, with one stall timer per request instead of one per read.

Reading pauses while more than `HIGH_WATER` bytes wait for the reader (a slow consumer), and `read_s`
of silence mid-response fails the request with StreamTimeout.
"""

from __future__ import annotations

import asyncio
import collections
from typing import cast

import httptools

HIGH_WATER = 1 << 20  # bytes buffered before the socket stops being read (the reader is slow)


class StreamError(Exception):
    """Base of this client's errors (the backend maps them to CascadeErrors)."""


class ConnectFailed(StreamError):
    """Could not open a connection (refused, unreachable, or no answer within `connect_s`)."""


class StreamTimeout(StreamError, TimeoutError):
    """The server sent nothing for `read_s` while a response was due."""


class ConnectionClosed(StreamError):
    """The server closed the connection, or sent something that is not HTTP/1.1, before the response ended."""


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; serves one request at a time, then goes back to the pool if kept alive."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_s: float) -> None:
        self.loop = loop
        self.read_s = read_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser: httptools.HttpResponseParser | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.received_any = False
        self.status = 0
        self.content_type = ""
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self._last_read = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        self.received_any = True
        if self._parser is None:  # bytes while no request is in flight: not a connection to reuse
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionClosed(f"unreadable HTTP response: {exc}"))

    def eof_received(self) -> bool | None:
        return False  # close the transport: we never half-close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._parser is not None and not self.complete:
            self._fail(ConnectionClosed("the server closed the connection mid-response"))
        self._cancel_timer()

    # -- httptools callbacks -----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        # Only the content type is kept: a 200 that is not the body asked for (an HTML error page from a
        # proxy) must fail as a backend fault, not parse as an empty answer.
        if name.lower() == b"content-type":
            self.content_type = value.decode("latin-1").strip().lower()

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._cancel_timer()
        self._wake()

    # -- used by http_stream.StreamPool / StreamResponse ---------------------------------------------------------
    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._chunks.clear()
        self._buffered = 0
        self._error = None
        self.status = 0
        self.content_type = ""
        self.headers_done = self.complete = self.keep_alive = self.received_any = False
        self._last_read = self.loop.time()
        self._timer = self.loop.call_at(self._last_read + self.read_s, self._check_stall)
        self.transport.write(request)

    async def wait(self) -> None:
        """Until something new happened (headers, body, end, error)."""
        if self._error is not None:
            raise self._error
        waiter = self.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def take(self) -> bytes:
        """All body bytes received and not taken yet (b"" if none)."""
        if not self._chunks:
            return b""
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    @property
    def failed(self) -> bool:
        return self._error is not None

    def finish(self) -> None:
        """The request is over: forget its parser and timer (the connection may serve the next one)."""
        self._parser = None
        self._cancel_timer()

    def close(self) -> None:
        self.finish()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.finish()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _check_stall(self) -> None:
        self._timer = None
        if self.complete or self._parser is None:
            return
        due = self._last_read + self.read_s
        if self.loop.time() >= due:
            self._fail(StreamTimeout(f"no data for {self.read_s:g} s"))
            self.abort()
        else:
            self._timer = self.loop.call_at(due, self._check_stall)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
