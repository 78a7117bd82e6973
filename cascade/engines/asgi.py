"""The bits of ASGI spoken by hand (scope, receive/send, body reading, JSON and byte responses): the scorer server
(scorer_server.py) and the test fakes (cascade/testing/fakes/) are plain ASGI apps, no framework, so that a fake
costs little CPU next to what it measures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


async def disconnected_within(receive: Receive, seconds: float) -> bool:
    """Wait `seconds` (simulated generation); True if the client disconnected meanwhile."""

    async def wait_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    try:
        await asyncio.wait_for(wait_disconnect(), timeout=seconds)
    except TimeoutError:
        return False
    return True


async def send_json(send: Send, status: int, payload: Any) -> None:
    await send_bytes(send, status, b"application/json", msgspec.json.encode(payload))


async def send_bytes(send: Send, status: int, content_type: bytes, body: bytes, chunked: bool = False) -> None:
    headers = [(b"content-type", content_type)]
    if not chunked:
        headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": chunked})
    if chunked:
        await send({"type": "http.response.body", "body": b""})
