"""SGLangBackend against SGLang's recorded wire format (tests/fixtures/sglang/), over real HTTP.

The fixture bytes are served verbatim by `Replay` on 127.0.0.1, which also records what the client
sent; the last tests run the client against the fake SGLang server and check that the fake speaks
the recorded shapes, so that the contract tests built on it exercise the real wire format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import msgspec
import pytest

from cascade.branches.backend import GenerationRequest, GenerationResult, StreamDelta, collect
from cascade.branches.sglang_client import SGLangBackend
from cascade.config import Timeouts
from cascade.errors import BackendFailed, BackendTimeout, BackendUnavailable, CascadeError, InvalidRequest
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.waiting import eventually
from tests.servers import Replay, Reply, dead_url

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sglang"
CHAT = ("POST", "/v1/chat/completions")
ABORT = ("POST", "/abort_request")
TIMEOUTS = Timeouts(connect_s=1.0, read_s=5.0, total_s=10.0)
# Request fields SGLang's chat route accepts (README: OpenAI fields + SGLang extras); we send a subset.
SGLANG_CHAT_FIELDS = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
    "stream", "stream_options", "logprobs", "tools", "rid", "top_k", "min_p", "separate_reasoning",
    "stream_reasoning", "chat_template_kwargs", "reasoning_effort", "return_meta_info", "priority",
}
T = TypeVar("T")
Replayed = tuple[str, Replay]  # (base URL, the app)
Served = tuple[str, FakeSGLang]


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def recorded_request(name: str) -> GenerationRequest:
    """The GenerationRequest that should produce the recorded request body `name`."""
    body = msgspec.json.decode(fixture(name))
    return GenerationRequest(
        messages=msgspec.convert(body["messages"], list[ChatMessage]),
        max_tokens=body["max_completion_tokens"], temperature=body["temperature"], top_p=body["top_p"],
        seed=body["seed"], stop=body.get("stop", []), request_id=body.get("rid", "cascade-chat-0001"),
    )


def with_backend(url: str, use: Callable[[SGLangBackend], Awaitable[T]], timeouts: Timeouts = TIMEOUTS) -> T:
    async def main() -> T:
        backend = SGLangBackend("sglang", url, "Qwen/Qwen3-8B", timeouts)
        try:
            return await use(backend)
        finally:
            await backend.aclose()

    return asyncio.run(main())


async def all_deltas(backend: SGLangBackend, request: GenerationRequest) -> list[StreamDelta]:
    return [delta async for delta in backend.stream(request)]


@pytest.fixture
def replay() -> Iterator[Replayed]:
    app = Replay({
        CHAT: Reply(body=fixture("chat_completion_response.json")),
        ABORT: Reply(body=b"", content_type="text/plain"),
        ("GET", "/health"): Reply(body=b"", content_type="text/plain"),
    })
    with serve_asgi(app) as url:
        yield url, app


def serve_stream(app: Replay, name: str, stall: bool = False) -> None:
    app.routes[CHAT] = Reply(body=fixture(name), content_type="text/event-stream", stall=stall)


# --- what the client sends -------------------------------------------------------------------


def test_request_body_has_the_recorded_fields_plus_rid_and_both_token_limits(replay: Replayed) -> None:
    url, app = replay
    serve_stream(app, "chat_completion_stream.txt")
    with_backend(url, lambda b: all_deltas(b, recorded_request("chat_completion_request.json")))
    sent = msgspec.json.decode(app.requests[0].body)
    # Recorded from a non-streamed call; the client always streams (a whole answer is a collected stream).
    expected = {**msgspec.json.decode(fixture("chat_completion_request.json")), "stream": True}
    assert {k: sent[k] for k in expected} == expected
    assert sent["max_tokens"] == sent["max_completion_tokens"] == 256
    assert sent["rid"] == "cascade-chat-0001"
    assert set(sent) <= SGLANG_CHAT_FIELDS


def test_streaming_request_body_asks_for_usage_and_carries_the_branch_rid(replay: Replayed) -> None:
    url, app = replay
    serve_stream(app, "chat_completion_stream.txt")
    with_backend(url, lambda b: all_deltas(b, recorded_request("chat_completion_stream_request.json")))
    sent = msgspec.json.decode(app.requests[0].body)
    expected = msgspec.json.decode(fixture("chat_completion_stream_request.json"))
    assert {k: sent[k] for k in expected} == expected
    assert sent["stream_options"] == {"include_usage": True} and sent["rid"] == "cascade-chat-0002"
    assert set(sent) <= SGLANG_CHAT_FIELDS


def test_request_without_a_request_id_gets_a_fresh_uuid_rid(replay: Replayed) -> None:
    url, app = replay
    serve_stream(app, "chat_completion_stream.txt")
    request = msgspec.structs.replace(recorded_request("chat_completion_request.json"), request_id="")
    with_backend(url, lambda b: all_deltas(b, request))
    with_backend(url, lambda b: all_deltas(b, request))
    rids = [msgspec.json.decode(r.body)["rid"] for r in app.requests]
    assert len(rids[0]) == 32 and int(rids[0], 16) >= 0
    assert rids[0] != rids[1]


# --- what the client reads -------------------------------------------------------------------


def test_recorded_stream_is_read_as_deltas_ending_with_finish_and_usage(replay: Replayed) -> None:
    url, app = replay
    serve_stream(app, "chat_completion_stream.txt")
    request = recorded_request("chat_completion_stream_request.json")
    deltas = with_backend(url, lambda b: all_deltas(b, request))
    # The recorded body arrives in one read, so its chunks may be merged into fewer deltas.
    assert "".join(d.reasoning for d in deltas) == "The user asks for the capital of France."
    assert "".join(d.text for d in deltas) == "The capital of France is Paris."
    assert sum(d.chunks for d in deltas if d.text or d.reasoning) == 4
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["stop"]
    assert (deltas[-1].prompt_tokens, deltas[-1].completion_tokens) == (14, 19)
    # The stream finished on its own: nothing to abort.
    assert [r.path for r in app.requests] == ["/v1/chat/completions"]


def test_recorded_stream_folds_into_the_same_result_as_a_completion(replay: Replayed) -> None:
    url, app = replay
    serve_stream(app, "chat_completion_stream.txt")
    request = recorded_request("chat_completion_stream_request.json")
    result = with_backend(url, lambda b: collect(b.stream(request)))
    # SGLang's own usage counts the reasoning tokens (10, in two chunks of several tokens each here).
    assert result == GenerationResult(
        text="The capital of France is Paris.", reasoning="The user asks for the capital of France.",
        finish_reason="stop", prompt_tokens=14, completion_tokens=19, reasoning_tokens=10, reasoning_chunks=2,
    )


def test_a_last_event_without_its_newline_or_done_is_still_read(replay: Replayed) -> None:
    url, app = replay
    body = fixture("chat_completion_stream.txt").replace(b"data: [DONE]", b"").rstrip(b"\n")
    app.routes[CHAT] = Reply(body=body, content_type="text/event-stream")
    result = with_backend(url, lambda b: collect(b.stream(recorded_request("chat_completion_stream_request.json"))))
    # The usage event is the body's last bytes, with no line end after it.
    assert (result.text, result.prompt_tokens, result.completion_tokens) == ("The capital of France is Paris.", 14, 19)


def test_health_is_read(replay: Replayed) -> None:
    url, _ = replay
    assert with_backend(url, lambda b: b.health()) is True


# --- errors ----------------------------------------------------------------------------------


def raised(url: str, timeouts: Timeouts = TIMEOUTS) -> CascadeError:
    request = recorded_request("chat_completion_request.json")

    async def use(backend: SGLangBackend) -> CascadeError:
        try:
            await all_deltas(backend, request)
        except CascadeError as exc:
            return exc
        raise AssertionError("no error raised")

    return with_backend(url, use, timeouts)


def test_recorded_400_is_an_invalid_request_with_sglang_message(replay: Replayed) -> None:
    url, app = replay
    app.routes[CHAT] = Reply(status=400, body=fixture("chat_completion_error_400.json"))
    error = raised(url)
    assert isinstance(error, InvalidRequest)
    assert "Messages cannot be empty." in error.message


def test_500_in_sglang_error_shape_is_a_backend_failure(replay: Replayed) -> None:
    url, app = replay
    body = {**msgspec.json.decode(fixture("chat_completion_error_400.json")),
            "message": "boom", "type": "InternalServerError", "code": 500}
    app.routes[CHAT] = Reply(status=500, body=msgspec.json.encode(body))
    error = raised(url)
    assert isinstance(error, BackendFailed) and "boom" in error.message


def test_in_band_stream_error_is_raised_with_its_status(replay: Replayed) -> None:
    url, app = replay
    serve_stream(app, "chat_completion_stream_error.txt")
    error = raised(url)
    # code 503 ("Request waiting timeout reached."): the engine is saturated, another replica may serve.
    assert isinstance(error, BackendUnavailable)
    assert "Request waiting timeout reached." in error.message


def test_connection_refused_is_backend_unavailable() -> None:
    assert isinstance(raised(dead_url()), BackendUnavailable)


@pytest.mark.parametrize("stall", ["before_any_event", "after_one_event"])
def test_stalled_response_is_a_timeout_and_is_aborted_upstream(replay: Replayed, stall: str) -> None:
    url, app = replay
    first_chunk = fixture("chat_completion_stream.txt").split(b"\n\n")[0] + b"\n\n"
    body = first_chunk if stall == "after_one_event" else b""
    app.routes[CHAT] = Reply(body=body, content_type="text/event-stream", stall=True)
    start = time.monotonic()
    error = raised(url, Timeouts(connect_s=1.0, read_s=0.2, total_s=10.0))
    assert isinstance(error, BackendTimeout)
    assert time.monotonic() - start < 2
    assert [msgspec.json.decode(r.body) for r in app.requests if r.path == "/abort_request"] == [
        {"rid": "cascade-chat-0001"}]


# --- the fake SGLang server speaks the recorded shapes ----------------------------------------


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key of a JSON value as a dotted path (list items share the path `[]`)."""
    if isinstance(value, dict):
        paths = set()
        for key, item in value.items():
            paths |= {f"{prefix}{key}"} | key_paths(item, f"{prefix}{key}.")
        return paths
    if isinstance(value, list):
        return set().union(*(key_paths(item, f"{prefix}[].") for item in value)) if value else set()
    return set()


def sse_objects(body: bytes) -> list[Any]:
    lines = [line[6:] for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [msgspec.json.decode(line) for line in lines[:-1]]


@pytest.fixture
def fake_sglang() -> Iterator[Served]:
    # Two reasoning tokens, two answer tokens: the same sequence of chunk kinds as the recording.
    # It never notices a client that went away by itself: only /abort_request stops a generation.
    app = FakeSGLang(FakeScript(answer="The_capital of_France_is_Paris.", model="Qwen/Qwen3-8B"),
                     reasoning="The user", disconnect_abort_s=30)
    with serve_asgi(app) as url:
        yield url, app


@pytest.fixture
def slow_fake_sglang() -> Iterator[Served]:
    """1000 tokens, 10 ms apart, unless aborted."""
    app = FakeSGLang(FakeScript(itl_ms=10, tokens=1000), disconnect_abort_s=30)
    with serve_asgi(app) as url:
        yield url, app


SLOW = [ChatMessage(role="user", content="hi")]


def test_fake_sglang_stream_has_the_recorded_chunk_shapes(fake_sglang: Served) -> None:
    url, _ = fake_sglang
    body = fixture("chat_completion_stream_request.json")
    response = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=5, trust_env=False)
    fake, recorded = sse_objects(response.content), sse_objects(fixture("chat_completion_stream.txt"))
    assert [key_paths(c) for c in fake] == [key_paths(c) for c in recorded]
    assert {c["id"] for c in fake} == {"cascade-chat-0002"}  # the rid, without `chatcmpl-`


def test_fake_sglang_completion_has_the_recorded_shape(fake_sglang: Served) -> None:
    url, _ = fake_sglang
    body = fixture("chat_completion_request.json")
    response = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=5, trust_env=False)
    recorded = key_paths(msgspec.json.decode(fixture("chat_completion_response.json")))
    # Recorded with --enable-cache-report; without it SGLang sends `prompt_tokens_details: null`.
    assert key_paths(response.json()) == recorded - {"usage.prompt_tokens_details.cached_tokens"}


def test_fake_sglang_health_and_model_info_match_the_recordings(fake_sglang: Served) -> None:
    url, app = fake_sglang
    with httpx.Client(base_url=url, timeout=5, trust_env=False) as client:
        info = client.get("/get_model_info").json()
        ok = client.get("/health")
        app.warming = True
        warming = client.get("/health")
        aborted = client.post("/abort_request", content=fixture("abort_request.json"))
    assert set(info) == set(msgspec.json.decode(fixture("get_model_info.json")))
    assert (ok.status_code, ok.content) == (200, b"")
    assert (warming.status_code, warming.content) == (503, b"")
    assert (aborted.status_code, aborted.content) == (200, b"")


def test_health_is_false_while_sglang_warms_up(fake_sglang: Served) -> None:
    url, app = fake_sglang
    assert with_backend(url, lambda b: b.health()) is True
    app.warming = True
    assert with_backend(url, lambda b: b.health()) is False


def test_abort_by_someone_else_ends_the_stream_with_finish_reason_abort(
    slow_fake_sglang: Served,
) -> None:
    url, app = slow_fake_sglang
    request = GenerationRequest(messages=SLOW, max_tokens=2000, request_id="cascade-operator-abort")

    async def use(backend: SGLangBackend) -> list[StreamDelta]:
        deltas = []
        async for delta in backend.stream(request):
            deltas.append(delta)
            if len(deltas) == 3:
                await backend.abort("cascade-operator-abort")
        return deltas

    deltas = with_backend(url, use)
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["abort"]
    assert deltas[-1].completion_tokens == app.stats.aborted["cascade-operator-abort"] < 1000
    # The stream ended with its finish chunk, so the client did not abort it a second time.
    assert app.stats.abort_requests == ["cascade-operator-abort"]


def test_a_cancelled_task_reading_a_stream_aborts_its_rid_upstream(slow_fake_sglang: Served) -> None:
    url, app = slow_fake_sglang
    request = GenerationRequest(messages=SLOW, max_tokens=2000, request_id="cascade-cancelled")

    async def use(backend: SGLangBackend) -> None:
        task = asyncio.create_task(collect(backend.stream(request)))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with_backend(url, use)
    assert eventually(lambda: "cascade-cancelled" in app.stats.aborted)
    assert app.stats.abort_requests == ["cascade-cancelled"]
    assert 0 < app.stats.aborted["cascade-cancelled"] < 1000


def test_stream_cancelled_by_an_anyio_scope_is_still_aborted_upstream(
    slow_fake_sglang: Served,
) -> None:
    """Litestar runs handlers in anyio cancel scopes, which re-cancel every await inside them: the
    abort must go out anyway."""
    url, app = slow_fake_sglang
    request = GenerationRequest(messages=SLOW, max_tokens=2000, request_id="cascade-scoped")

    async def use(backend: SGLangBackend) -> int:
        seen = 0
        with anyio.move_on_after(0.1):
            async for _ in backend.stream(request):
                seen += 1
        return seen

    seen = with_backend(url, use)
    assert 0 < seen < 1000
    assert app.stats.abort_requests == ["cascade-scoped"]
    assert eventually(lambda: "cascade-scoped" in app.stats.aborted)
    assert app.stats.aborted["cascade-scoped"] < 1000
