"""One contract for every Backend: each implementation runs the same tests against fake engines
served over real HTTP on 127.0.0.1 (or, for the in-process fake, against its own script).

- openai: OpenAIBackend -> FakeEngine
- sglang: SGLangBackend -> FakeSGLang (which, unlike FakeEngine, ignores a client that went away
  for 30 s, so that only `/abort_request` can stop a generation within the tests' bounds)
- pool:   ReplicaPool over two OpenAIBackends -> two FakeEngines
- fake:   cascade.branches.fakes.FakeBackend, no HTTP, scripted by the fake engine's own `[fake ...]`
  directives (cascade.testing.fakes.engine.script_for), so that the same requests expect the same answers
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest

from cascade.branches.backend import Backend, GenerationRequest, StreamDelta, collect
from cascade.branches.fakes import FakeBackend
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.pool import ReplicaPool
from cascade.branches.sglang_client import SGLangBackend
from cascade.config import Timeouts
from cascade.errors import BackendFailed, BackendUnavailable
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript, script_for, token_pieces
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.waiting import eventually
from tests.servers import Replay, Reply, dead_url

TIMEOUTS = Timeouts(connect_s=1.0, read_s=5.0, total_s=10.0)
STOP_BOUND_S = 2.0  # an early-closed stream must stop upstream within this (s)


def request(directive: str = "", max_tokens: int = 2000) -> GenerationRequest:
    return GenerationRequest(
        messages=[ChatMessage(role="user", content=f"hello {directive}")], max_tokens=max_tokens,
        request_id=f"cascade-{uuid.uuid4().hex}",
    )


def stats(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/fake/stats", timeout=5, trust_env=False)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


# --- the implementations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Flavor:
    # Starts one engine for the duration of the stack and gives its address.
    serve: Callable[[ExitStack], str]
    replicas: int
    backend: Callable[[list[str]], Backend]
    # Did the generation `rid` stop before its end, given the engines' /fake/stats?
    stopped_early: Callable[[list[dict[str, Any]], str], bool]
    stats: Callable[[str], dict[str, Any]] = stats


def served(engine: Callable[[], FakeEngine]) -> Callable[[ExitStack], str]:
    return lambda stack: stack.enter_context(serve_asgi(engine()))


# The in-process fakes by address: an address plays an engine's URL (one that is not here is "dead").
FAKES: dict[str, FakeBackend] = {}


def directed(request: GenerationRequest) -> Iterator[StreamDelta]:
    """What the fake engine would stream for `request` (its `[fake tokens= status=]` directives)."""
    script = script_for(FakeScript(), {"messages": msgspec.to_builtins(request.messages)})
    if script.status != 200:
        raise BackendFailed(f"backend `fake` returned HTTP {script.status}: scripted failure {script.status}", "fake")
    pieces = token_pieces(script, request.max_tokens)
    yield from (StreamDelta(text=piece) for piece in pieces)
    yield StreamDelta(finish_reason="length" if len(pieces) < script.tokens else "stop", chunks=0,
                      prompt_tokens=8, completion_tokens=len(pieces))


def serve_fake(stack: ExitStack) -> str:
    address = f"fake://{uuid.uuid4().hex}"
    FAKES[address] = FakeBackend("fake", directed)

    def stop() -> None:  # as an engine that went away: refused, and unhealthy
        FAKES.pop(address).up = False

    stack.callback(stop)
    return address


def fake_backend(urls: list[str]) -> Backend:
    return FAKES.get(urls[0]) or FakeBackend("fake", directed, up=False)


def fake_stats(address: str) -> dict[str, Any]:
    return msgspec.structs.asdict(FAKES[address].stats)


def _cancelled(all_stats: list[dict[str, Any]], rid: str) -> bool:
    return sum(s["streams_cancelled"] for s in all_stats) == 1 and all(s["in_flight"] == 0 for s in all_stats)


def _aborted(all_stats: list[dict[str, Any]], rid: str) -> bool:
    [s] = all_stats
    return s["in_flight"] == 0 and 0 < s["aborted"].get(rid, 1 << 30) < 1000


def make_pool(urls: list[str]) -> ReplicaPool:
    return ReplicaPool("pool", [OpenAIBackend(f"replica-{i}", url, "fake-model", TIMEOUTS) for i, url in enumerate(urls)])


FLAVORS = {
    "openai": Flavor(
        served(FakeEngine), 1, lambda urls: OpenAIBackend("openai", urls[0], "fake-model", TIMEOUTS), _cancelled
    ),
    "sglang": Flavor(
        served(lambda: FakeSGLang(disconnect_abort_s=30)), 1,
        lambda urls: SGLangBackend("sglang", urls[0], "fake-model", TIMEOUTS), _aborted,
    ),
    "pool": Flavor(served(FakeEngine), 2, make_pool, _cancelled),
    "fake": Flavor(serve_fake, 1, fake_backend, _cancelled, fake_stats),
}
HTTP_FLAVORS = sorted(name for name in FLAVORS if name != "fake")


@dataclass
class Subject:
    """A Backend implementation with its fake engines running."""

    flavor: Flavor
    urls: list[str]
    stop_servers: Callable[[], None]

    @asynccontextmanager
    async def connect(self, urls: list[str] | None = None) -> AsyncIterator[Backend]:
        backend = self.flavor.backend(urls or self.urls)
        try:
            yield backend
        finally:
            await backend.aclose()

    def stats(self) -> list[dict[str, Any]]:
        return [self.flavor.stats(url) for url in self.urls]


@pytest.fixture(params=sorted(FLAVORS))
def flavor(request: pytest.FixtureRequest) -> Flavor:
    return FLAVORS[request.param]


@pytest.fixture
def subject(flavor: Flavor) -> Iterator[Subject]:
    with ExitStack() as servers:
        urls = [flavor.serve(servers) for _ in range(flavor.replicas)]
        yield Subject(flavor, urls, servers.close)


# --- the contract ----------------------------------------------------------------------------


def test_a_collected_stream_has_text_and_usage(subject: Subject) -> None:
    async def main() -> Any:
        async with subject.connect() as backend:
            assert isinstance(backend, Backend)
            return await collect(backend.stream(request("[fake tokens=5]")))

    result = asyncio.run(main())
    assert (result.text, result.finish_reason) == ("t0 t1 t2 t3 t4 ", "stop")
    assert (result.prompt_tokens, result.completion_tokens) == (8, 5)


def test_a_stream_stops_at_max_tokens_with_finish_reason_length(subject: Subject) -> None:
    async def main() -> Any:
        async with subject.connect() as backend:
            return await collect(backend.stream(request("[fake tokens=5]", max_tokens=3)))

    result = asyncio.run(main())
    assert (result.text, result.finish_reason, result.completion_tokens) == ("t0 t1 t2 ", "length", 3)


def test_stream_deltas_concatenate_to_the_text_and_end_with_a_finish_reason(subject: Subject) -> None:
    async def main() -> list[StreamDelta]:
        async with subject.connect() as backend:
            return [d async for d in backend.stream(request("[fake tokens=7]"))]

    deltas = asyncio.run(main())
    assert "".join(d.text for d in deltas) == "".join(f"t{i} " for i in range(7))
    finishes = [i for i, d in enumerate(deltas) if d.finish_reason is not None]
    assert len(finishes) == 1 and deltas[finishes[0]].finish_reason == "stop"
    # The finishing delta may carry the last text (deltas that arrive together are merged);
    # after it comes nothing but usage.
    assert all(not d.text for d in deltas[finishes[0] + 1 :])
    assert (deltas[-1].prompt_tokens, deltas[-1].completion_tokens) == (8, 7)


def test_closing_a_stream_early_stops_the_generation_upstream(subject: Subject) -> None:
    branch = request("[fake itl_ms=10 tokens=1000]")

    async def main() -> list[StreamDelta]:
        async with subject.connect() as backend, aclosing(backend.stream(branch)) as deltas:
            return [await anext(deltas), await anext(deltas)]

    first_two = asyncio.run(main())
    assert [d.text for d in first_two] == ["t0 ", "t1 "]
    assert eventually(lambda: subject.flavor.stopped_early(subject.stats(), branch.request_id), STOP_BOUND_S)


def test_health_is_true_when_up_and_false_when_the_server_is_down(subject: Subject) -> None:
    async def healthy() -> bool:
        async with subject.connect() as backend:
            return await backend.health()

    assert asyncio.run(healthy()) is True
    subject.stop_servers()
    assert asyncio.run(healthy()) is False


def test_unreachable_url_raises_backend_unavailable(flavor: Flavor) -> None:
    async def main() -> None:
        backend = flavor.backend([dead_url() for _ in range(flavor.replicas)])
        try:
            await collect(backend.stream(request()))
        finally:
            await backend.aclose()

    with pytest.raises(BackendUnavailable):
        asyncio.run(main())


def test_scripted_500_raises_backend_failed(subject: Subject) -> None:
    async def main() -> None:
        async with subject.connect() as backend:
            await collect(backend.stream(request("[fake status=500]")))

    with pytest.raises(BackendFailed, match="500"):
        asyncio.run(main())


# --- ReplicaPool -----------------------------------------------------------------------------


Engines = tuple[list[str], list[FakeEngine]]  # (base URLs, the apps)


@pytest.fixture
def two_engines() -> Iterator[Engines]:
    engines = [FakeEngine(), FakeEngine()]
    with ExitStack() as servers:
        yield [servers.enter_context(serve_asgi(e)) for e in engines], engines


def test_pool_sends_requests_to_the_replica_with_fewest_outstanding(
    two_engines: Engines,
) -> None:
    urls, engines = two_engines

    async def main() -> dict[str, int]:
        pool = make_pool(urls)
        try:
            async with aclosing(pool.stream(request("[fake itl_ms=10 tokens=1000]"))) as busy:
                await anext(busy)  # one request in flight on one replica
                for _ in range(4):  # round robin would put two of these on the busy replica
                    await pool.generate(request("[fake tokens=2]"))
                return {replica.name: replica.outstanding for replica in pool.states()}
        finally:
            await pool.aclose()

    outstanding = asyncio.run(main())
    assert sorted(outstanding.values()) == [0, 1]
    assert sorted(e.stats.requests for e in engines) == [1, 4]
    busy = max(engines, key=lambda e: e.stats.streams_cancelled)  # the long stream, closed at the end
    assert busy.stats.requests == 1


def test_the_pools_whole_answer_is_its_collected_stream(two_engines: Engines) -> None:
    urls, _ = two_engines

    async def main() -> tuple[Any, Any]:
        pool = make_pool(urls)
        try:
            return await pool.generate(request()), await collect(pool.stream(request()))
        finally:
            await pool.aclose()

    generated, streamed = asyncio.run(main())
    assert streamed == generated and generated.text == "".join(f"t{i} " for i in range(16))


@pytest.mark.parametrize(("replicas", "error"), [("dead", BackendUnavailable), ("500", BackendFailed)])
def test_the_pools_whole_answer_raises_the_backend_error(two_engines: Engines, replicas: str, error: type) -> None:
    urls, _ = two_engines

    async def main() -> None:
        pool = make_pool([dead_url(), dead_url()] if replicas == "dead" else urls)
        try:
            await pool.generate(request("[fake status=500]"))
        finally:
            await pool.aclose()

    with pytest.raises(error):
        asyncio.run(main())


def test_pool_fails_over_from_a_dead_replica_to_a_live_one(two_engines: Engines) -> None:
    urls, engines = two_engines

    async def main() -> list[Any]:
        pool = make_pool([dead_url(), urls[0]])
        try:
            results = [await pool.generate(request("[fake tokens=3]")) for _ in range(3)]
            results += [await collect(pool.stream(request("[fake tokens=3]"))) for _ in range(3)]
            assert await pool.health() is True
            return results
        finally:
            await pool.aclose()

    results = asyncio.run(main())
    assert [r.text for r in results] == ["t0 t1 t2 "] * 6
    assert engines[0].stats.requests == 6


# --- SGLang ----------------------------------------------------------------------------------


def test_closing_an_sglang_stream_early_sends_abort_request_with_the_branch_rid() -> None:
    engine = FakeSGLang(disconnect_abort_s=30)
    branch = request("[fake itl_ms=10 tokens=1000]")
    with serve_asgi(engine) as url:

        async def main() -> None:
            backend = SGLangBackend("sglang", url, "fake-model", TIMEOUTS)
            try:
                async with aclosing(backend.stream(branch)) as deltas:
                    await anext(deltas)
                    assert stats(url)["in_flight"] == 1
            finally:
                await backend.aclose()

        asyncio.run(main())
        assert stats(url)["abort_requests"] == [branch.request_id]
        assert eventually(lambda: stats(url)["in_flight"] == 0, STOP_BOUND_S)
        assert 0 < stats(url)["aborted"][branch.request_id] < 1000


# --- answers that did not end properly -------------------------------------------------------

_CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"t0 "},"finish_reason":null}]}\n\n'
BROKEN_STREAMS = {
    "html_page": Reply(body=b"<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html"),
    "json_instead_of_events": Reply(body=b'{"error": {"message": "upstream failed"}}'),
    "events_without_finish_reason": Reply(body=_CHUNK * 3, content_type="text/event-stream"),
    "events_without_finish_then_done": Reply(body=_CHUNK + b"data: [DONE]\n\n", content_type="text/event-stream"),
    "events_not_json": Reply(body=b"data: {oops\n\n", content_type="text/event-stream"),
    "no_events_at_all": Reply(body=b": keep-alive\n\n", content_type="text/event-stream"),
}


def _broken_backend(flavor: str, url: str) -> Backend:
    return FLAVORS[flavor].backend([url] * FLAVORS[flavor].replicas)


@pytest.mark.parametrize("flavor_name", HTTP_FLAVORS)
@pytest.mark.parametrize("case", sorted(BROKEN_STREAMS))
def test_a_stream_that_did_not_end_properly_raises_backend_failed(flavor_name: str, case: str) -> None:
    replay = Replay({("POST", "/v1/chat/completions"): BROKEN_STREAMS[case]})
    with serve_asgi(replay) as url:

        async def main() -> None:
            backend = _broken_backend(flavor_name, url)
            try:
                await collect(backend.stream(request()))
            finally:
                await backend.aclose()

        with pytest.raises(BackendFailed):
            asyncio.run(main())


@pytest.mark.parametrize("case", sorted(BROKEN_STREAMS))
def test_a_whole_answer_from_the_pool_that_did_not_end_properly_raises_backend_failed(case: str) -> None:
    replay = Replay({("POST", "/v1/chat/completions"): BROKEN_STREAMS[case]})
    with serve_asgi(replay) as url:

        async def main() -> None:
            pool = make_pool([url] * 2)
            try:
                await pool.generate(request())
            finally:
                await pool.aclose()

        with pytest.raises(BackendFailed):
            asyncio.run(main())
