"""The in-process fakes keep the promises their protocols make, also when scripted to misbehave."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import aclosing

import pytest

from cascade.branches.backend import Backend, GenerationRequest, StreamDelta, collect
from cascade.branches.fakes import FakeBackend, FakeScorer
from cascade.branches.scoring import Scorer
from cascade.errors import BackendFailed, BackendTimeout
from cascade.schemas import ChatMessage

REQUEST = GenerationRequest(messages=[ChatMessage(role="user", content="hi")], max_tokens=100)


def test_the_fakes_are_instances_of_their_protocols() -> None:
    assert isinstance(FakeBackend(), Backend) and isinstance(FakeScorer(), Scorer)


def test_the_default_script_answers_numbered_tokens_up_to_max_tokens() -> None:
    short = GenerationRequest(messages=REQUEST.messages, max_tokens=3)
    result = asyncio.run(collect(FakeBackend().stream(short)))
    assert (result.text, result.finish_reason, result.completion_tokens) == ("t0 t1 t2 ", "length", 3)


def test_a_script_that_fails_mid_answer_raises_after_the_deltas_before_it() -> None:
    def script(request: GenerationRequest) -> Iterator[StreamDelta]:
        yield StreamDelta(text="half ")
        raise BackendFailed("scripted", "fake")

    async def main() -> list[str]:
        seen = []
        with pytest.raises(BackendFailed, match="scripted"):
            async for delta in FakeBackend(script=script).stream(REQUEST):
                seen.append(delta.text)
        return seen

    assert asyncio.run(main()) == ["half "]


def test_a_script_without_a_finish_reason_is_an_incomplete_answer() -> None:
    backend = FakeBackend(script=lambda request: [StreamDelta(text="cut")])
    with pytest.raises(BackendFailed, match="without a finish reason"):
        asyncio.run(collect(backend.stream(REQUEST)))
    assert backend.stats.streams_failed == 1 and backend.stats.in_flight == 0


def test_closing_a_fake_stream_early_counts_it_cancelled() -> None:
    backend = FakeBackend(delay_s=0.001)

    async def main() -> None:
        async with aclosing(backend.stream(REQUEST)) as deltas:
            await anext(deltas)

    asyncio.run(main())
    assert (backend.stats.streams_cancelled, backend.stats.streams_finished, backend.stats.in_flight) == (1, 0, 0)


def test_the_fake_scorer_clips_its_rule_and_raises_its_fault() -> None:
    assert asyncio.run(FakeScorer(lambda q, s: 7.0).score("q", ["a"])) == 1.0
    with pytest.raises(BackendTimeout):
        asyncio.run(FakeScorer(fault=BackendTimeout("slow PRM", "fake")).score("q", ["a"]))
