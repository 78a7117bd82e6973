"""The gateway's streaming HTTP client (cascade/branches/http_stream.py) against real servers on
127.0.0.1: the fake engine under uvicorn (chunked SSE, keep-alive, stalls, disconnects) and raw
asyncio servers for what a well-behaved server never does (closing mid-body, closing kept-alive
connections, huge bodies)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from cascade.branches.http_connection import HIGH_WATER, ConnectFailed, ConnectionClosed, StreamTimeout
from cascade.branches.http_stream import StreamPool
from cascade.engines.supervisor import free_port
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.waiting import eventually

HEADERS = {"Content-Type": "application/json"}


def chat(prompt: str = "hi", max_tokens: int = 8) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "stream": True}).encode()


async def read_body(pool: StreamPool, body: bytes) -> tuple[int, bytes]:
    response = await pool.post("/v1/chat/completions", body, HEADERS)
    try:
        return response.status, await response.read_all()
    finally:
        response.release()


def test_streams_sse_and_reuses_the_connection() -> None:
    engine = FakeEngine(FakeScript(tokens=5))
    with serve_asgi(engine) as url:
        async def run() -> None:
            pool = StreamPool(url, connect_s=2, read_s=5)
            for _ in range(3):
                status, body = await read_body(pool, chat())
                assert status == 200
                events = [line for line in body.split(b"\n") if line.startswith(b"data:")]
                assert events[-1] == b"data: [DONE]" and sum(b'"content":"t' in e for e in events) == 5
            assert pool.idle_connections == 1  # one connection served all three
            pool.close()
        asyncio.run(run())


def test_an_error_status_comes_with_its_body() -> None:
    with serve_asgi(FakeEngine(FakeScript(status=503))) as url:
        async def run() -> None:
            pool = StreamPool(url, connect_s=2, read_s=5)
            status, body = await read_body(pool, chat())
            assert status == 503 and "error" in json.loads(body)
            pool.close()
        asyncio.run(run())


def test_a_closed_port_is_connect_failed() -> None:
    async def run() -> None:
        pool = StreamPool(f"http://127.0.0.1:{free_port()}", connect_s=2, read_s=5)
        with pytest.raises(ConnectFailed, match="cannot connect"):
            await pool.post("/v1/chat/completions", chat(), HEADERS)
    asyncio.run(run())


def test_a_stalled_stream_times_out_after_read_s() -> None:
    with serve_asgi(FakeEngine(FakeScript(tokens=50, stall_after=2))) as url:
        async def run() -> None:
            pool = StreamPool(url, connect_s=2, read_s=0.3)
            response = await pool.post("/v1/chat/completions", chat(max_tokens=50), HEADERS)
            with pytest.raises(StreamTimeout, match=r"no data for 0\.3 s"):
                await response.read_all()
            response.release()
            assert pool.idle_connections == 0
        asyncio.run(run())


def test_releasing_mid_stream_disconnects_so_the_engine_stops() -> None:
    engine = FakeEngine(FakeScript(tokens=1000, itl_ms=5))
    with serve_asgi(engine) as url:
        async def run() -> None:
            pool = StreamPool(url, connect_s=2, read_s=5)
            response = await pool.post("/v1/chat/completions", chat(max_tokens=1000), HEADERS)
            assert await response.read()
            response.release()
            assert pool.idle_connections == 0
        asyncio.run(run())
        assert eventually(lambda: engine.stats.streams_cancelled == 1, within_s=5)


async def with_raw_server(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                          body: Callable[[str], Awaitable[None]]) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await body(f"http://127.0.0.1:{port}")
    finally:
        server.close()
        await asyncio.sleep(0.05)  # let closed transports finish closing inside this loop


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)


def test_a_server_closing_mid_body_is_connection_closed() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        writer.close()

    async def body(url: str) -> None:
        pool = StreamPool(url, connect_s=2, read_s=5)
        response = await pool.post("/x", b"{}", HEADERS)
        with pytest.raises(ConnectionClosed, match="mid-response"):
            await response.read_all()
        response.release()
        pool.close()
    asyncio.run(with_raw_server(handler, body))


def test_a_kept_alive_connection_the_server_dropped_is_replaced_transparently() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # keep-alive promised, then dropped while the client's connection sits idle

    async def body(url: str) -> None:
        pool = StreamPool(url, connect_s=2, read_s=5)
        assert await read_body(pool, b"{}") == (200, b"ok")
        await asyncio.sleep(0.2)
        assert await read_body(pool, b"{}") == (200, b"ok")
        assert connections == 2
        pool.close()
    asyncio.run(with_raw_server(handler, body))


def test_a_body_larger_than_the_high_water_mark_arrives_whole() -> None:
    size = 3 * HIGH_WATER

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        writer.close()

    async def body(url: str) -> None:
        pool = StreamPool(url, connect_s=2, read_s=5)
        response = await pool.post("/x", b"{}", HEADERS)
        await asyncio.sleep(0.3)  # let the server fill the buffer past the mark: reading pauses
        data = await response.read_all()
        response.release()
        assert len(data) == size
        pool.close()
    asyncio.run(with_raw_server(handler, body))


def test_requests_beyond_max_connections_wait_for_a_free_one() -> None:
    with serve_asgi(FakeEngine(FakeScript(tokens=3))) as url:
        async def run() -> None:
            pool = StreamPool(url, connect_s=2, read_s=5, max_connections=1)
            first = await pool.post("/v1/chat/completions", chat(), HEADERS)
            second = asyncio.create_task(pool.post("/v1/chat/completions", chat(), HEADERS))
            await asyncio.sleep(0.2)
            assert not second.done()
            await first.read_all()
            first.release()
            response = await asyncio.wait_for(second, 5)
            assert response.status == 200 and b"[DONE]" in await response.read_all()
            response.release()
            pool.close()
        asyncio.run(run())


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="http"):
        StreamPool("unix:///tmp/x", connect_s=1, read_s=1)
