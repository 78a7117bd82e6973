"""A client that reads slowly costs the gateway bounded memory, whatever `n` it asks for: the engines are held back
(TCP backpressure) rather than their answers buffered. An `n = 4` stream to a client that read nothing once grew a
gateway by 160 MB; `n = 1` always applied backpressure.

The engine is a raw server on 127.0.0.1 that streams large deltas as fast as the socket takes them (16 MiB per
choice); the service reads a few frames, then nothing for a while, and the test measures what Python allocated
meanwhile (tracemalloc; the engine's writes wait on the socket, so its buffers stay small).
"""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest

from cascade.config import decode_config
from cascade.service.chat import ChatService, ServiceConfig, StreamReply
from cascade.service.metrics import GatewayMetrics
from cascade.testing.servers import TIERS, ladder_toml
from cascade.tiers.build import build_tiers
from tests.branches.test_http_stream import read_request, with_raw_server
from tests.gateway.gateway_setup import user
from tests.service.test_lease import request

EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 32_768 + b'"}, "finish_reason": null}]}\n\n'
EVENTS = 512  # 16 MiB per choice: an unbounded buffer would hold most of it for every choice
GROWTH_LIMIT_BYTES = 24 << 20  # per choice, a connection's read buffer (1 MiB) and a few deltas read ahead


async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    try:
        for _ in range(EVENTS):
            writer.write(EVENT)
            await writer.drain()  # waits while the gateway does not read
        writer.write(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.mark.parametrize("n", [1, 8])
def test_a_client_that_stops_reading_holds_the_engines_back_instead_of_growing_the_gateway(n: int) -> None:
    grew = 0

    async def body(url: str) -> None:
        nonlocal grew
        config = decode_config(ladder_toml(url))
        tiers = build_tiers(config, {})
        service = ChatService(tiers, ServiceConfig.of(config), GatewayMetrics())
        tracemalloc.start()
        try:
            reply = await service.chat(request(model=TIERS[0], stream=True, n=n, messages=user("count")))
            assert isinstance(reply, StreamReply)
            try:
                for _ in range(4 * n):  # past each choice's first delta: every stream is being read
                    await anext(reply.frames)
                before = tracemalloc.get_traced_memory()[0]
                await asyncio.sleep(2.0)  # not reading: the engines fill whatever stands between them and the client
                grew = tracemalloc.get_traced_memory()[0] - before
            finally:
                await reply.frames.aclose()
        finally:
            tracemalloc.stop()
            for tier in tiers:
                await tier.backend.aclose()

    asyncio.run(with_raw_server(engine, body))
    assert grew < GROWTH_LIMIT_BYTES, f"the gateway grew by {grew / 2**20:.1f} MiB while its client read nothing"
