"""The HTTP/1.1 client's parser: bodies split anywhere across reads parse the same; framing variants."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadgen.client import ResponseSink
from loadgen.http import Connection, Endpoint, HttpError
from loadgen.pool import Collect, Pool


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.aborted = self.closed_ = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed_ = True


SSE = (b'data: {"model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
       b'data: {"model":"m","choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n'
       b'data: {"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
       b'"cascade":{"tier":1,"tier_name":"mid"}}\n\n'
       b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
       b"data: [DONE]\n\n")


def chunked(body: bytes, size: int = 40) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


def feed(response: bytes, splits: list[int], sink: Any) -> tuple[Connection, Pool]:
    async def go() -> tuple[Connection, Pool]:
        pool = Pool(Endpoint("http://127.0.0.1:1"))
        conn = Connection(pool)
        conn.connection_made(FakeTransport())  # type: ignore[arg-type]
        done = conn.start(b"GET / HTTP/1.1\r\n\r\n", sink, None)
        last = 0
        for cut in [*splits, len(response)]:
            if cut > last:
                conn.data_received(response[last:cut])
                last = cut
        await asyncio.wait_for(done, 1)
        return conn, pool

    return asyncio.run(go())


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-cascade-tier: mid\r\ntransfer-encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("step", [1, 3, 7, 50, 10_000])
def test_a_chunked_stream_split_anywhere_parses_the_same(step: int) -> None:
    response = HEAD + chunked(SSE)
    sink = ResponseSink(stream=True)
    conn, pool = feed(response, list(range(step, len(response), step)), sink)
    sink.finish(0.0)
    assert sink.status == 200 and sink.error is None
    assert "".join(sink.texts) == "Hello"
    assert (sink.tier, sink.tier_index, sink.usage_tokens, sink.finish_reason) == ("mid", 1, 2, "stop")
    assert sink.chunks == 2 and len(sink.itl) == 1
    assert pool.idle == [conn]  # keep-alive: back in the pool


def test_content_length_and_connection_close_are_honoured() -> None:
    body = b'{"error": {"message": "nope", "type": "x"}}'
    response = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n" + body)
    sink = ResponseSink(stream=True)
    conn, pool = feed(response, [10, 60], sink)
    sink.finish(0.0)
    assert sink.error == "HTTP 503: nope"
    assert pool.idle == [] and conn.closed


def test_a_body_read_until_close_ends_with_the_connection() -> None:
    async def go() -> bytes:
        conn = Connection(Pool(Endpoint("http://127.0.0.1:1")))
        conn.connection_made(FakeTransport())  # type: ignore[arg-type]
        sink = Collect()
        done = conn.start(b"GET / HTTP/1.1\r\n\r\n", sink, None)
        conn.data_received(b"HTTP/1.0 200 OK\r\n\r\nhello ")
        conn.data_received(b"world")
        conn.connection_lost(None)
        await done
        return bytes(sink.body)

    assert asyncio.run(go()) == b"hello world"


def test_a_connection_closed_mid_stream_is_an_error() -> None:
    async def go() -> HttpError:
        conn = Connection(Pool(Endpoint("http://127.0.0.1:1")))
        conn.connection_made(FakeTransport())  # type: ignore[arg-type]
        done = conn.start(b"GET / HTTP/1.1\r\n\r\n", Collect(), None)
        conn.data_received(HEAD + b"10\r\nabc")
        conn.connection_lost(ConnectionResetError("reset"))
        with pytest.raises(HttpError) as info:
            await done
        return info.value

    error = asyncio.run(go())
    assert "connection lost" in error.message and not error.before_response


@pytest.mark.parametrize("url", ["ftp://x", "http://", "localhost:8000"])
def test_urls_that_are_not_http_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="URL must look like"):
        Endpoint(url)
