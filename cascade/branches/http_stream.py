"""A minimal HTTP/1.1 client for the gateway's hot path: streamed POSTs to one engine, kept alive.

Why not aiohttp here: at 200 concurrent streams with 10 ms between tokens, aiohttp's request setup,
StreamReader and per-read timeout rescheduling were ~35% of the gateway's CPU (py-spy,
benchmarks/gateway_overhead.py), more than the engine spent producing the tokens. This client is an
asyncio Protocol around httptools (uvicorn's parser, already installed): one prebuilt request write,
body bytes handed to the reader as they arrive, and one stall timer per request instead of one per
read. It does only what the stream path needs: POST, a JSON body, status, de-chunked body bytes,
keep-alive, TLS for https engines. Everything else (control-plane calls) stays on aiohttp.

Limits: `max_connections` open connections per origin (more requests wait), `max_idle` kept alive,
`read_s` of silence mid-response is a timeout, reading pauses while more than `HIGH_WATER` bytes wait
for the reader.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from typing import cast
from urllib.parse import urlsplit

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


class _Connection(asyncio.Protocol):
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

    # -- used by StreamPool / StreamResponse ---------------------------------------------------------
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


class StreamResponse:
    """The response to one `StreamPool.post`: `status` and `content_type` (lower case, parameters
    included), then body bytes by `read()` until it returns b""."""

    __slots__ = ("_conn", "_pool", "_released", "content_type", "status")

    def __init__(self, pool: StreamPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self._released = False
        self.status = conn.status
        self.content_type = conn.content_type

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end of the body."""
        conn = self._conn
        while True:
            data = conn.take()
            if data or conn.complete:
                return data
            await conn.wait()

    async def read_all(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """Hand the connection back: kept alive if the response was read to its end, else closed (which
        also tells the engine to stop generating). Idempotent."""
        if not self._released:
            self._released = True
            self._pool._release(self._conn)


class StreamPool:
    """Keep-alive connections to one origin (`url`: scheme://host[:port], any path ignored)."""

    def __init__(self, url: str, connect_s: float, read_s: float, max_connections: int = 4096,
                 max_idle: int = 1024) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"StreamPool needs an http(s) URL, got {url!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        default_port = self.port == (443 if self.tls else 80)
        self._host_header = (f"[{self.host}]" if ":" in self.host else self.host) + (
            "" if default_port else f":{self.port}")
        self.connect_s = connect_s
        self.read_s = read_s
        self.max_idle = max_idle
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None

    def request_head(self, path: str, content_length: int, headers: dict[str, str]) -> bytes:
        lines = [f"POST {path} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {content_length}",
                 *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        return "\r\n".join(lines).encode("latin-1")

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> StreamResponse:
        """Send the request and wait for the response's status line and headers."""
        request = self.request_head(path, len(body), headers) + body
        await self._slots.acquire()
        try:
            # A kept-alive connection the server closed in the meantime fails before any response byte:
            # then, and only then, the request is sent once more on a new connection.
            while self._idle:
                conn = self._idle.pop()
                if conn.closed or conn.transport is None or conn.transport.is_closing():
                    continue
                try:
                    return await self._exchange(conn, request)
                except ConnectionClosed:
                    if conn.received_any:
                        raise
            return await self._exchange(await self._connect(), request)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, conn: _Connection, request: bytes) -> StreamResponse:
        try:
            conn.send(request)
            while not conn.headers_done:
                await conn.wait()
        except BaseException:
            conn.abort()
            raise
        return StreamResponse(self, conn)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(loop, self.read_s)
        try:
            async with asyncio.timeout(self.connect_s):
                await loop.create_connection(lambda: conn, self.host, self.port, ssl=self._ssl)
        except TimeoutError:
            raise ConnectFailed(f"no connection to {self.host}:{self.port} within {self.connect_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        return conn

    def _release(self, conn: _Connection) -> None:
        self._slots.release()
        if conn.complete and conn.keep_alive and not conn.failed and not conn.closed and \
                len(self._idle) < self.max_idle:
            conn.finish()
            self._idle.append(conn)
        else:
            # Mid-response: abort, so the engine sees the client go away and stops generating.
            conn.abort()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
