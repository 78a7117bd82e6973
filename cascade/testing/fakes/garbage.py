"""A raw TCP server that answers every request with bytes that are not HTTP (an upstream that is not
an HTTP server at all): ``cascade fake-server --fault garbage``. It cannot be an ASGI app like the
rest of the fake engine (cascade/testing/fakes/engine.py), since uvicorn only writes valid HTTP."""

from __future__ import annotations

import asyncio
import contextlib

GARBAGE = b"\x00\x01garbage not http\r\n\r\n"


async def _answer_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Wait for the request's head, answer bytes that are not HTTP, and close once the client has gone
    (closing with its bytes unread would turn the answer into a connection reset)."""
    try:
        with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
        writer.write(GARBAGE)
        writer.write_eof()  # half-close: the client reads the garbage, then end of stream
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_drain_until_eof(reader), 2.0)
    except OSError:
        pass
    finally:
        writer.close()


async def _drain_until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


async def start_garbage_server(host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """A raw TCP server that answers every connection with `GARBAGE`; port 0 picks a free one
    (`server.sockets[0].getsockname()[1]`). The caller closes it."""
    return await asyncio.start_server(_answer_garbage, host, port)


def serve_garbage(host: str, port: int) -> None:
    """Run the garbage server until interrupted (`cascade fake-server --fault garbage`)."""

    async def run() -> None:
        async with await start_garbage_server(host, port) as server:
            await server.serve_forever()

    asyncio.run(run())
