"""Keep-alive connections to one endpoint, and one request/response exchange over them."""

from __future__ import annotations

import asyncio
import ssl

from loadgen.http import Connection, Endpoint, HttpError, Sink


class Pool:
    """Keep-alive connections to one endpoint, opened on demand (an open-loop client needs one per
    request in flight) and reused last-in first-out."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self.all: set[Connection] = set()
        self.opened = 0
        self._ssl = ssl.create_default_context() if endpoint.scheme == "https" else None

    async def acquire(self) -> tuple[Connection, bool]:
        """A connection and whether it was reused."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn, True
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(self), ep.host, ep.port, ssl=self._ssl,
                                       server_hostname=ep.host if self._ssl else None),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise HttpError(f"connect to {ep.host}:{ep.port} timed out after {self.connect_timeout_s:g} s",
                            before_response=True) from None
        except OSError as exc:
            raise HttpError(f"cannot connect to {ep.host}:{ep.port}: {exc.strerror or exc}",
                            before_response=True) from None
        self.opened += 1
        self.all.add(conn)
        return conn, False

    def release(self, conn: Connection) -> None:
        self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self.all.discard(conn)

    def close(self) -> None:
        for conn in list(self.all):
            if conn.transport is not None:
                conn.transport.abort()
        self.idle.clear()
        self.all.clear()


def request_bytes(endpoint: Endpoint, method: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {endpoint.base_path}{path} HTTP/1.1", f"Host: {endpoint.host_header}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Collect:
    """A Sink that keeps the whole body (for small, non-streamed responses)."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()

    def on_sent(self, t: float) -> None:
        pass

    def on_head(self, status: int, headers: dict[str, str], t: float) -> None:
        self.status, self.headers = status, headers

    def on_body(self, data: bytes, t: float) -> None:
        self.body += data


class Started:
    """An exchange already written on a reused connection (see `start_now`)."""

    __slots__ = ("conn", "done")

    def __init__(self, conn: Connection, done: asyncio.Future[None]) -> None:
        self.conn, self.done = conn, done


def start_now(pool: Pool, request: bytes, sink: Sink, timeout_s: float | None) -> Started | None:
    """Write `request` right away on an idle keep-alive connection, without yielding to the event
    loop (so a dispatcher that just woke up sends at once); None when no connection is idle."""
    while pool.idle:
        conn = pool.idle.pop()
        if not conn.closed:
            return Started(conn, conn.start(request, sink, timeout_s))
    return None


async def exchange(pool: Pool, request: bytes, sink: Sink, timeout_s: float | None,
                   started: Started | None = None) -> None:
    """Send `request` (or finish the `started` exchange) and feed the response to `sink`; `on_sent`
    gets the time the request was written.

    A reused keep-alive connection that the server closed meanwhile fails before any response
    byte: that case is retried once on a fresh connection, as browsers and HTTP libraries do.
    """
    if started is not None:
        try:
            await started.done
            return
        except HttpError as exc:
            if not exc.before_response:
                raise
        except asyncio.CancelledError:
            started.conn.abort("cancelled")
            raise
    for attempt in (0, 1):
        conn, reused = await pool.acquire()
        try:
            await conn.start(request, sink, timeout_s)
            return
        except HttpError as exc:
            if not (reused and exc.before_response and attempt == 0 and started is None):
                raise
        except asyncio.CancelledError:
            conn.abort("cancelled")
            raise
    raise AssertionError("unreachable")
