"""A minimal HTTP/1.1 client for the gateway's hot path: streamed POSTs to one engine, kept alive.

Why not aiohttp here: at 200 concurrent streams with 10 ms between tokens, aiohttp's request setup,
StreamReader and per-read timeout rescheduling were ~35% of the gateway's CPU (py-spy,
benchmarks/frontdoor/gateway_overhead.py), more than the engine spent producing the tokens. This client is an
asyncio Protocol around httptools (uvicorn's parser, already installed; one connection of it is
cascade/branches/http_connection.py, with the client's errors): one prebuilt request write, body bytes
handed to the reader as they arrive, and one stall timer per request instead of one per read. It does
only what the stream path needs: POST, a JSON body, status, de-chunked body bytes, keep-alive, TLS for
https engines. Everything else (control-plane calls) stays on aiohttp.

Limits: `max_connections` open connections per origin (more requests wait), `max_idle` kept alive,
`read_s` of silence mid-response is a timeout, reading pauses while more than
`http_connection.HIGH_WATER` bytes wait for the reader.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from urllib.parse import urlsplit

from cascade.branches.http_connection import ConnectFailed, Connection, ConnectionClosed


class StreamResponse:
    """The response to one `StreamPool.post`: `status` and `content_type` (lower case, parameters
    included), then body bytes by `read()` until it returns b""."""

    __slots__ = ("_conn", "_pool", "_released", "content_type", "status")

    def __init__(self, pool: StreamPool, conn: Connection) -> None:
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

    async def read_all(self, limit: int | None = None) -> bytes:
        """The rest of the body; with `limit`, its first `limit` bytes at most (reading stops there, and
        `release()` then closes the connection: an error body of gigabytes is not held)."""
        parts, size = [], 0
        while data := await self.read():
            parts.append(data)
            size += len(data)
            if limit is not None and size >= limit:
                break
        body = b"".join(parts)
        return body if limit is None else body[:limit]

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
        self._idle: list[Connection] = []
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None

    @property
    def idle_connections(self) -> int:
        """Connections kept alive for the next request (at most `max_idle`; none after `close`). One the server
        has closed since is counted until the next `post` drops it."""
        return len(self._idle)

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

    async def _exchange(self, conn: Connection, request: bytes) -> StreamResponse:
        try:
            conn.send(request)
            while not conn.headers_done:
                await conn.wait()
        except BaseException:
            conn.abort()
            raise
        return StreamResponse(self, conn)

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        conn = Connection(loop, self.read_s)
        try:
            async with asyncio.timeout(self.connect_s):
                await loop.create_connection(lambda: conn, self.host, self.port, ssl=self._ssl)
        except TimeoutError:
            raise ConnectFailed(f"no connection within {self.connect_s:g} s") from None
        except OSError as exc:  # no address in the text (asyncio's strerror has one): it reaches clients
            raise ConnectFailed(f"cannot connect: {os.strerror(exc.errno) if exc.errno else type(exc).__name__}") \
                from None
        return conn

    def _release(self, conn: Connection) -> None:
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
