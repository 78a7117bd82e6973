"""Real HTTP servers for tests. `serve_asgi` (an ASGI app served by uvicorn on 127.0.0.1 in a thread, stopped
when its block exits) and `eventually` (poll a condition with a bound) live in cascade/testing/ (asgi.py,
waiting.py), shared with the benchmarks. `Replay` is a canned upstream: it answers each route with fixed bytes
and records what it was sent. `Recorder` stands in front of a real (fake) engine and records each chat request and
the answer it got. `dead_url` is a loopback URL that refuses connections.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from cascade.engines.asgi import read_body
from cascade.engines.supervisor import free_port

Scope = dict[str, Any]


def dead_url() -> str:
    """A loopback URL where nothing listens (connections are refused)."""
    return f"http://127.0.0.1:{free_port()}"


class Reply(msgspec.Struct, kw_only=True):
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    # True: send the headers and `body`, then hang until the client goes away (a stalled stream).
    stall: bool = False


class Recorded(msgspec.Struct):
    method: str
    path: str
    body: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)


class Replay:
    """ASGI app answering `(method, path)` with a fixed `Reply` (404 otherwise), byte for byte."""

    def __init__(self, routes: dict[tuple[str, str], Reply]) -> None:
        self.routes = routes
        self.requests: list[Recorded] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(Recorded(scope["method"], scope["path"], body, headers))
        not_found = Reply(status=404, body=b'{"detail":"Not Found"}')
        reply = self.routes.get((scope["method"], scope["path"]), not_found)
        headers = [(b"content-type", reply.content_type.encode())]
        if not reply.stall:
            headers.append((b"content-length", str(len(reply.body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body, "more_body": reply.stall})
        if reply.stall:
            while (await receive())["type"] != "http.disconnect":
                pass


class Exchange(msgspec.Struct):
    body: dict[str, Any]
    status: int = 0
    content_type: str = ""
    response: bytes = b""


class Recorder:
    """ASGI middleware in front of an engine: records each chat request's body and the response sent to it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [e.body for e in self.exchanges]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        exchange = Exchange(json.loads(raw))
        self.exchanges.append(exchange)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return dict(await receive())

        async def record(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                exchange.content_type = dict(message.get("headers", [])).get(b"content-type", b"").decode()
            elif message["type"] == "http.response.body":
                exchange.response += message.get("body", b"")
            await send(message)

        await self.app(scope, replay, record)


@contextmanager
def open_streams(url: str, n: int, prompt: str = "hi", timeout_s: float = 30) -> Iterator[None]:
    """`n` clients of an engine other than the one under test (another gateway's, say): long streamed chats sent
    straight to `url`, each on its own thread, open until the block ends."""
    import httpx

    stop = threading.Event()

    def client() -> None:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout_s) as response:
            for _ in response.iter_bytes():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=client, daemon=True) for _ in range(n)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
