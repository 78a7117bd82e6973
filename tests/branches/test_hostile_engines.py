"""What a broken or hostile engine sends cannot grow without bound in the gateway: a stream line with no end, an
error body of gigabytes, a control-plane answer that never stops. Real sockets on 127.0.0.1 (raw asyncio servers
write what no well-behaved engine does) against the real client, cascade/branches/openai_client.py."""

from __future__ import annotations

import asyncio

import pytest

from cascade.branches import openai_client, openai_wire
from cascade.branches.backend import GenerationRequest
from cascade.branches.openai_client import OpenAIBackend
from cascade.config import Timeouts
from cascade.errors import BackendFailed
from cascade.schemas import ChatMessage
from tests.branches.test_http_stream import read_request, with_raw_server

REQUEST = GenerationRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=8)
TIMEOUTS = Timeouts(connect_s=2, read_s=10, total_s=60)


async def drain(backend: OpenAIBackend) -> list[str]:
    return [delta.text async for delta in backend.stream(REQUEST)]


async def send_until_dropped(writer: asyncio.StreamWriter, pieces: int, piece: bytes) -> int:
    """Write `piece` up to `pieces` times, stopping when the client hangs up; then close. Returns the bytes sent."""
    sent = 0
    try:
        for _ in range(pieces):
            writer.write(piece)
            sent += len(piece)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
    return sent


def test_a_stream_line_without_an_end_is_dropped_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_wire, "MAX_EVENT_BYTES", 1 << 20)
    sent = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: ")
        sent = await send_until_dropped(writer, 4096, b"x" * 16384)  # 64 MiB of one line, unless the client hangs up

    async def body(url: str) -> None:
        backend = OpenAIBackend("hostile/0", url, "m", TIMEOUTS)
        with pytest.raises(BackendFailed, match=r"hostile/0.*stream line over 1048576 bytes"):
            await drain(backend)
        await backend.aclose()

    asyncio.run(with_raw_server(handler, body))
    assert sent < 16 << 20  # the client stopped reading soon after the limit, not at the end of the line


def test_an_error_body_of_gigabytes_is_read_to_its_first_64_kib_only() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # Announces 1 GiB, sends 1 MiB of it, then waits: a client reading to the end would time out.
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 1073741824"
                     b"\r\n\r\n" + b"E" * (1 << 20))
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    async def body(url: str) -> None:
        backend = OpenAIBackend("hostile/1", url, "m", TIMEOUTS)
        with pytest.raises(BackendFailed, match=r"HTTP 500: E+$") as raised:
            await drain(backend)
        assert len(raised.value.message) < 400  # the message is an excerpt, whatever the body's size
        await backend.aclose()

    asyncio.run(with_raw_server(handler, body))


@pytest.mark.parametrize("announced", [True, False])
def test_a_control_plane_answer_past_its_limit_is_a_backend_failure(monkeypatch: pytest.MonkeyPatch,
                                                                    announced: bool) -> None:
    monkeypatch.setattr(openai_client, "CONTROL_BODY_BYTES", 1 << 20)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        size = 4 << 20
        head = f"Content-Length: {size}" if announced else "Transfer-Encoding: chunked"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{head}\r\n\r\n".encode())
        piece = b"y" * 65536
        await send_until_dropped(writer, size // len(piece), piece if announced else b"%x\r\n%s\r\n" % (len(piece), piece))

    async def body(url: str) -> None:
        backend = OpenAIBackend("hostile/2", url, "m", TIMEOUTS)
        with pytest.raises(BackendFailed, match=r"hostile/2.*GET /health with a body.*over the 1048576-byte limit"):
            await backend.request("GET", "/health")
        assert await backend.health() is False
        await backend.aclose()

    asyncio.run(with_raw_server(handler, body))


def stream_with_usage(prompt: object, completion: object) -> bytes:
    usage = f'{{"prompt_tokens": {prompt}, "completion_tokens": {completion}, "total_tokens": 0}}'
    body = (b'data: {"choices": [{"index": 0, "delta": {"content": "4"}, "finish_reason": null}]}\n\n'
            b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": '
            + usage.encode() + b"}\n\ndata: [DONE]\n\n")
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.mark.parametrize(("prompt", "completion", "match"), [
    (-5, 1, "prompt_tokens = -5"),
    (10**12, 1, "prompt_tokens = 1000000000000"),
    (3, -1, "completion_tokens = -1"),
    (3, 9, "completion_tokens = 9"),  # max_tokens is 8
    (3, 1.5, "completion_tokens = 1.5, not a whole number"),
    (12.5, 1, "prompt_tokens = 12.5, not a whole number"),
    ('"3"', 1, "unreadable stream chunk"),
    (10**30, 1, "prompt_tokens = 1" + "0" * 30),
])
def test_usage_no_engine_could_report_for_the_request_is_an_engine_fault(prompt: object, completion: object,
                                                                         match: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(stream_with_usage(prompt, completion))
        await writer.drain()
        writer.close()

    async def body(url: str) -> None:
        backend = OpenAIBackend("liar/0", url, "m", TIMEOUTS)
        with pytest.raises(BackendFailed, match=rf"liar/0.*{match}"):
            await drain(backend)
        await backend.aclose()

    asyncio.run(with_raw_server(handler, body))


def test_usage_within_what_the_request_allows_is_taken_as_reported() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(stream_with_usage(4000, 8))  # a template may add more tokens than a short body has bytes
        await writer.drain()
        writer.close()

    async def body(url: str) -> None:
        backend = OpenAIBackend("honest/0", url, "m", TIMEOUTS)
        deltas = [delta async for delta in backend.stream(REQUEST)]
        assert deltas[-1].prompt_tokens == 4000 and deltas[-1].completion_tokens == 8
        await backend.aclose()

    asyncio.run(with_raw_server(handler, body))
