"""A minimal HTTP/1.1 client on asyncio protocols, built for measuring, not for features.

Why not aiohttp or httpx: every response byte is timestamped in `data_received`, when the event
loop reads it from the socket, so a busy loop delays the bookkeeping but not the measurement; and
a streamed response costs no coroutine switch per chunk (the body is handed to a `Sink`
callback), which keeps a 2-core client at hundreds of requests per second.

The connection pool and the exchange helper are in `loadgen.pool`.

Supported: keep-alive connection reuse, `Content-Length`, chunked and read-until-close bodies,
`https` (stdlib ssl), a per-exchange deadline. Not supported (not needed against OpenAI-style
servers): redirects, compression, HTTP/2, proxies.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast
from urllib.parse import urlsplit

_MAX_HEAD_BYTES = 64 * 1024


class HttpError(Exception):
    """The exchange failed below HTTP: refused, reset, closed early, timed out or malformed."""

    def __init__(self, message: str, *, before_response: bool = False) -> None:
        super().__init__(message)
        self.message = message
        # True when no response byte arrived: the request may be retried on a fresh connection.
        self.before_response = before_response


class Sink(Protocol):
    def on_sent(self, t: float) -> None: ...

    def on_head(self, status: int, headers: dict[str, str], t: float) -> None: ...

    def on_body(self, data: bytes, t: float) -> None: ...


class Owner(Protocol):
    """Who gets a connection back when its exchange ends (the pool)."""

    def release(self, conn: Connection) -> None: ...

    def forget(self, conn: Connection) -> None: ...


class Endpoint:
    """Where requests go: scheme, host, port and the base path of the URL."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL must look like http://HOST[:PORT][/path], got {url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        default_port = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        self.host_header = self.host if default_port else f"{self.host}:{self.port}"


# Parser states.
_IDLE, _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _UNTIL_CLOSE = range(8)


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one exchange at a time."""

    def __init__(self, pool: Owner) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buf = b""  # unparsed bytes left over from the last read
        self.state = _IDLE
        self.remaining = 0
        self.keep_alive = True
        self.sink: Sink | None = None
        self.done: asyncio.Future[None] | None = None
        self.got_bytes = False
        self.timer: asyncio.TimerHandle | None = None
        self.no_body = False

    # --- asyncio callbacks -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        if self.sink is None:  # bytes nobody asked for: the connection is unusable
            self.abort("unexpected bytes from the server")
            return
        self.got_bytes = True
        if self.buf:
            data, self.buf = self.buf + data, b""
        try:
            self._parse(data, t)
        except (ValueError, IndexError) as exc:
            self.abort(f"malformed HTTP response: {exc}")

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.sink is None:
            return
        if self.state == _UNTIL_CLOSE:
            self._finish()
            return
        reason = f"connection lost: {exc}" if exc else "the server closed the connection"
        self._fail(HttpError(reason, before_response=not self.got_bytes))

    # --- exchange ------------------------------------------------------------------------

    def start(self, request: bytes, sink: Sink, timeout_s: float | None, no_body: bool = False) -> asyncio.Future[None]:
        assert self.transport is not None and self.sink is None
        loop = asyncio.get_running_loop()
        self.sink = sink
        self.done = loop.create_future()
        self.state = _HEAD
        self.got_bytes = False
        self.keep_alive = True
        self.no_body = no_body
        self.buf = b""
        if timeout_s is not None:
            self.timer = loop.call_later(timeout_s, self._timed_out, timeout_s)
        sink.on_sent(time.perf_counter())
        self.transport.write(request)
        return self.done

    def abort(self, reason: str) -> None:
        """Fail the current exchange (if any) and drop the connection."""
        self._fail(HttpError(reason))
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _timed_out(self, timeout_s: float) -> None:
        self.timer = None
        self.abort(f"timed out after {timeout_s:g} s")

    def _detach(self) -> asyncio.Future[None] | None:
        """End the current exchange: drop its sink and timer; return its future if still pending."""
        done = self.done
        self.sink, self.done, self.state = None, None, _IDLE
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return done if done is not None and not done.done() else None

    def _fail(self, exc: HttpError) -> None:
        if (done := self._detach()) is not None:
            done.set_exception(exc)

    def _finish(self) -> None:
        if (done := self._detach()) is not None:
            done.set_result(None)
        if self.keep_alive and not self.closed and not self.buf:
            self.pool.release(self)
        elif self.transport is not None:
            self.closed = True
            self.transport.close()

    # --- parsing -------------------------------------------------------------------------

    def _parse(self, data: bytes, t: float) -> None:
        """Parse `data` from offset 0; keep what is incomplete in `self.buf`. All body bytes of one read
        go to the sink in one call (they arrived at the same time)."""
        pos, size = 0, len(data)
        body: list[bytes] = []
        while self.sink is not None:
            state = self.state
            if state == _CHUNK_SIZE:
                end = data.find(b"\r\n", pos)
                if end < 0:
                    break
                length = int(data[pos:end].split(b";", 1)[0], 16)
                pos = end + 2
                self.remaining = length
                self.state = _CHUNK_DATA if length else _TRAILER
            elif state in (_CHUNK_DATA, _LENGTH):
                if pos >= size:
                    break
                take = min(self.remaining, size - pos)
                body.append(data[pos : pos + take])
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    if state == _LENGTH:
                        self._deliver(body, t)
                        self._finish()
                    else:
                        self.state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:
                if size - pos < 2:
                    break
                pos += 2
                self.state = _CHUNK_SIZE
            elif state == _HEAD:
                end = data.find(b"\r\n\r\n", pos)
                if end < 0:
                    if size - pos > _MAX_HEAD_BYTES:
                        raise ValueError("response head too large")
                    break
                head = data[pos:end].decode("latin-1")
                pos = end + 4
                self._on_head(head, t)
            elif state == _TRAILER:
                end = data.find(b"\r\n", pos)
                if end < 0:
                    break
                blank = end == pos
                pos = end + 2
                if blank:
                    self._deliver(body, t)
                    self._finish()
            elif state == _UNTIL_CLOSE:
                body.append(data[pos:])
                pos = size
                break
            else:
                break
        self._deliver(body, t)
        if pos < size:
            if self.sink is not None:
                self.buf = data[pos:]
            else:  # bytes past the end of the response: the connection cannot be trusted any more
                self.closed = True
                if self.transport is not None:
                    self.transport.abort()

    def _deliver(self, body: list[bytes], t: float) -> None:
        if body and self.sink is not None:
            self.sink.on_body(body[0] if len(body) == 1 else b"".join(body), t)
        body.clear()

    def _on_head(self, head: str, t: float) -> None:
        lines = head.split("\r\n")
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(rest[:3])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # interim response: the real head follows
            return
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
        assert self.sink is not None
        self.sink.on_head(status, headers, t)
        if self.no_body or status in (204, 304):
            self._finish()
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _CHUNK_SIZE
        elif "content-length" in headers:
            self.remaining = int(headers["content-length"])
            self.state = _LENGTH
            if self.remaining == 0:
                self._finish()
        else:
            self.keep_alive = False
            self.state = _UNTIL_CLOSE
