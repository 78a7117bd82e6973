"""What every route does with a request before its work (after the API key check, cascade/service/keys/tenants.py):
reading the body under the size limit. One copy for the Litestar routes (cascade/gateway/app.py) and the plain-ASGI
chat completions route (cascade/gateway/chat_asgi.py), so both refuse the same requests with the same errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

from cascade.errors import PayloadTooLarge


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The body from its `chunks`, refused (PayloadTooLarge) as soon as its declared `Content-Length` or what
    has arrived exceeds `limit` bytes."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {limit}", None, "request_too_large")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes", None, "request_too_large")
        parts.append(chunk)
    return b"".join(parts)
