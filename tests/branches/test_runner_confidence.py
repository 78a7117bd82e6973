"""Confidence pruning in the branch runner (DeepConf's online rule) against the fake engine over real HTTP: a
branch whose recent tokens are unsure is stopped without any scorer, never the last live branch, and only when
the engine sends token logprobs."""

from __future__ import annotations

import asyncio
import uuid

from cascade.branches.backend import GenerationRequest
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.runner import BranchRun, BranchRunner, BranchSettings
from cascade.config import Timeouts
from cascade.engines.fake_server import FakeEngine, FakeScript
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi

ANSWER = "[fake answer=3_*_6_=_18.|So_the_answer_is_18.|####_18 itl_ms=10]"
PRUNING = BranchSettings(n=3, m=2, prune_confidence=0.5, confidence_group=4)


def run(settings: BranchSettings, directives: str, logprobs: bool = True) -> tuple[BranchRun, FakeEngine]:
    fake = FakeEngine(FakeScript())
    extra = {"logprobs": True} if logprobs else {}
    requests = [GenerationRequest(messages=[ChatMessage(role="user", content=f"Q {ANSWER} {directives}")],
                                  max_tokens=400, temperature=0.7, seed=i, request_id=f"b-{uuid.uuid4().hex}",
                                  extra=extra) for i in range(settings.n)]

    async def go(url: str) -> BranchRun:
        backend = OpenAIBackend("fake", url, "fake-model", Timeouts(connect_s=1, read_s=5, total_s=20))
        try:
            return await BranchRunner(backend, settings).run("Q", requests)
        finally:
            await backend.aclose()

    with serve_asgi(fake) as url:
        return asyncio.run(go(url)), fake


def test_an_unsure_branch_is_pruned_on_its_group_confidence_and_the_sure_ones_vote() -> None:
    result, fake = run(PRUNING, "[fake@seed=1 logprob=-3]")
    report = result.report
    assert report.pruned_confidence == 1 and report.finished == 2 and report.votes == {"18": 2}
    assert dict(enumerate(state for _, state in result.branch_texts))[1] == "pruned"
    assert fake.stats.streams_cancelled + fake.stats.streams_finished == 3
    assert len(result.logprobs) == result.completion_tokens  # the returned branch's logprobs, one per token


def test_the_last_live_branch_is_never_pruned() -> None:
    settings = BranchSettings(n=2, m=1, prune_confidence=0.5, confidence_group=4)
    result, _ = run(settings, "[fake logprob=-3]")
    assert result.report.pruned_confidence == 1 and result.report.finished == 1 and result.text.endswith("18")


def test_without_logprobs_or_below_nothing_is_pruned() -> None:
    no_logprobs, _ = run(PRUNING, "[fake@seed=1 logprob=-3]", logprobs=False)
    assert no_logprobs.report.pruned_confidence == 0 and no_logprobs.logprobs == []
    sure, _ = run(PRUNING, "[fake@seed=1 logprob=-0.5]")  # exp(-0.5) = 0.61 >= 0.5
    assert sure.report.pruned_confidence == 0
