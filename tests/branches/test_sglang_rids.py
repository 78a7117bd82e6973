"""SGLang's request-id rules, on the fake SGLang server over real HTTP, and what the branch runner makes of them.

SGLang (srt/managers/tokenizer_manager.py, scheduler.py) refuses a rid already in flight with a 400, and
`/abort_request` acts only when its exact rid is in flight, then on every rid that starts with it. The
runner's rids come from cascade/tiers/upstream.py, which keeps them distinct and prefix-free; a branch the engine
refuses or aborts ends alone, and never counts as finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import httpx
import msgspec
import pytest

from cascade.branches.backend import GenerationRequest
from cascade.branches.fakes import FakeScorer
from cascade.branches.runner import BranchRun, BranchRunner, BranchSettings
from cascade.branches.sglang_client import SGLangBackend
from cascade.config import Timeouts
from cascade.errors import BackendFailed, InvalidRequest
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.waiting import eventually
from cascade.tiers import upstream

T = TypeVar("T")
Served = tuple[str, FakeSGLang]
RIGHT = "3_*_6_=_18.|So_the_answer_is_18.|####_18"
WRONG = "3_*_6_=_19.|So_the_answer_is_19.|####_19"
BAD = "|".join(f"BAD_step_{k}." for k in range(30))
HANG_BOUND_S = 15  # a run that has not returned by then hangs


@pytest.fixture
def sglang() -> Iterator[Served]:
    # 30 tokens 20 ms apart: every branch is still in flight while the others are refused, pruned or aborted.
    app = FakeSGLang(FakeScript(itl_ms=20, tokens=30), disconnect_abort_s=30)
    with serve_asgi(app) as url:
        yield url, app


def chat(rid: str, stream: bool = True, tokens: int = 30) -> dict[str, object]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": f"hi [fake tokens={tokens}]"}],
            "stream": stream, "rid": rid}


async def in_flight(client: httpx.AsyncClient, app: FakeSGLang, rids: list[str], tokens: int = 200
                    ) -> list[asyncio.Task[bytes]]:
    """Start a stream of `tokens` (20 ms apart) for each rid and wait until the fake runs them all."""
    async def read(rid: str) -> bytes:
        response = await client.post("/v1/chat/completions", json=chat(rid, tokens=tokens))
        return response.content

    tasks = [asyncio.create_task(read(rid)) for rid in rids]
    while app.stats.in_flight < len(rids):
        await asyncio.sleep(0.01)
    return tasks


def with_client(url: str, use: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client:
            return await use(client)

    return asyncio.run(main())


# --- the fake enforces SGLang's rules ------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_fake_sglang_refuses_a_rid_already_in_flight_with_sglangs_400(sglang: Served, stream: bool) -> None:
    url, app = sglang

    async def use(client: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        first = await in_flight(client, app, ["cascade-dup"], tokens=15)
        refused = await client.post("/v1/chat/completions", json=chat("cascade-dup", stream))
        await asyncio.gather(*first)
        again = await client.post("/v1/chat/completions", json=chat("cascade-dup", stream, tokens=2))
        return refused, again

    refused, again = with_client(url, use)
    # serving_chat.py: the ValueError from TokenizerManager._init_req_state, raised before the first chunk.
    assert refused.status_code == 400
    assert refused.json() == {"object": "error", "message": "Duplicate request ID detected: cascade-dup",
                              "type": "BadRequestError", "param": None, "code": 400}
    assert again.status_code == 200  # a finished rid may be used again
    assert app.stats.streams_started == 1 + stream


def test_fake_sglang_abort_of_a_rid_not_in_flight_stops_nothing(sglang: Served) -> None:
    url, app = sglang

    async def use(client: httpx.AsyncClient) -> None:
        running = await in_flight(client, app, ["cascade-x-10"])
        await client.post("/abort_request", json={"rid": "cascade-x-1"})  # a prefix, but not itself in flight
        await client.post("/abort_request", json={"rid": ""})  # SGLang ignores an empty rid
        await asyncio.sleep(0.1)
        assert app.stats.aborted == {}
        await client.post("/abort_request", json={"rid": "cascade-x-10"})
        await asyncio.gather(*running)

    with_client(url, use)
    assert list(app.stats.aborted) == ["cascade-x-10"]


def test_fake_sglang_abort_stops_every_rid_in_flight_that_starts_with_the_one_given(sglang: Served) -> None:
    url, app = sglang

    async def use(client: httpx.AsyncClient) -> list[bytes]:
        running = await in_flight(client, app, ["cascade-x-1", "cascade-x-10", "cascade-x-2"])
        await client.post("/abort_request", json={"rid": "cascade-x-1"})
        bodies = await asyncio.gather(*running[:2])
        # The hazard cascade/tiers/upstream.py's rids avoid: aborting `-1` also aborted `-10`, and only that.
        assert set(app.stats.aborted) == {"cascade-x-1", "cascade-x-10"} and app.stats.in_flight == 1
        await client.post("/abort_request", json={"abort_all": True})
        return [*bodies, await running[2]]

    bodies = with_client(url, use)
    assert set(app.stats.aborted) == {"cascade-x-1", "cascade-x-10", "cascade-x-2"}
    assert all(b'"finish_reason":"abort"' in body for body in bodies)


# --- the branch runner on SGLang --------------------------------------------------------------


def branches(n: int, directives: str = "") -> list[GenerationRequest]:
    template = GenerationRequest(messages=[ChatMessage(role="user", content=f"Q {directives}")], max_tokens=400,
                                 seed=0, request_id=upstream.new_base())
    return upstream.branch_requests(template, 1, n, temperature=0.7)[0]


def run(url: str, settings: BranchSettings, requests: list[GenerationRequest], scorer: FakeScorer | None = None,
        meanwhile: Callable[[SGLangBackend], Awaitable[None]] | None = None) -> BranchRun:
    async def main() -> BranchRun:
        backend = SGLangBackend("sglang", url, "fake-model", Timeouts(connect_s=1, read_s=5, total_s=20))
        try:
            task = asyncio.create_task(BranchRunner(backend, settings, scorer).run("Q", requests))
            if meanwhile is not None:
                await meanwhile(backend)
            return await asyncio.wait_for(task, HANG_BOUND_S)
        finally:
            await backend.aclose()

    return asyncio.run(main())


def test_pruning_one_of_twelve_branches_aborts_only_that_branch_upstream(sglang: Served) -> None:
    url, app = sglang
    requests = branches(12, f"[fake@seed=1 answer={BAD}]")
    scorer = FakeScorer(lambda _, steps: 0.0 if any("BAD" in s for s in steps) else 1.0)
    settings = BranchSettings(n=12, m=12, alpha=0.5, beta=1, k=1)
    report = run(url, settings, requests, scorer).report
    pruned = requests[1].request_id
    assert (report.pruned_phase1, report.finished, report.failed) == (1, 11, 0)
    assert eventually(lambda: app.stats.in_flight == 0)
    # Its siblings `-b10` and `-b11` were in flight too: none of them started with the aborted rid.
    assert app.stats.abort_requests == [pruned] and list(app.stats.aborted) == [pruned]
    assert app.stats.streams_finished == 12


def test_a_branch_refused_with_400_mid_request_ends_only_that_branch(sglang: Served) -> None:
    url, _ = sglang
    run_ = run(url, BranchSettings(n=3, m=3), branches(3, f"[fake answer={RIGHT} itl_ms=20] "
                                                                      "[fake@seed=1 status=400]"))
    report = run_.report
    assert (report.launched, report.finished, report.failed) == (3, 2, 1)
    assert report.answer == "18" and report.votes == {"18": 2}


def test_a_branch_refused_as_a_duplicate_rid_ends_only_that_branch(sglang: Served) -> None:
    url, app = sglang
    first, second = branches(2)
    twins = [first, msgspec.structs.replace(second, request_id=first.request_id)]  # the bug of issue 30
    report = run(url, BranchSettings(n=2, m=2), twins).report
    assert (report.finished, report.failed) == (1, 1)
    assert app.stats.streams_started == 1


def test_when_every_branch_is_refused_the_run_raises_the_refusal_instead_of_hanging(sglang: Served) -> None:
    url, _ = sglang
    with pytest.raises(InvalidRequest, match="scripted failure 400"):
        run(url, BranchSettings(n=3, m=2), branches(3, "[fake status=400]"))


def test_a_branch_aborted_upstream_is_counted_failed_and_does_not_vote(sglang: Served) -> None:
    url, app = sglang
    requests = branches(3, f"[fake answer={RIGHT}] [fake@seed=2 answer={WRONG}|{BAD} itl_ms=20]")

    async def abort_branch_two(backend: SGLangBackend) -> None:
        while app.stats.in_flight < 3:  # branch 2 streams for seconds, the others for ~0.2 s
            await asyncio.sleep(0.01)
        await backend.abort(requests[2].request_id)  # someone else (an operator) aborts it

    report = run(url, BranchSettings(n=3, m=3), requests, meanwhile=abort_branch_two).report
    assert list(app.stats.aborted) == [requests[2].request_id]
    assert (report.finished, report.failed, report.early_stopped) == (2, 1, 0)
    assert report.votes == {"18": 2} and report.answer == "18"


def test_a_run_whose_every_branch_is_aborted_upstream_fails_cleanly(sglang: Served) -> None:
    url, app = sglang
    requests = branches(2, "[fake tokens=500]")

    async def abort_all(backend: SGLangBackend) -> None:
        while app.stats.in_flight < 2:
            await asyncio.sleep(0.01)
        await backend.request("POST", "/abort_request", b'{"abort_all": true}')

    with pytest.raises(BackendFailed, match="aborted the branch"):
        run(url, BranchSettings(n=2, m=1), requests, meanwhile=abort_all)
