"""Confidence pruning in the branch runner (DeepConf's online rule) against the fake engine over real HTTP: a
branch whose recent tokens are unsure is stopped without any scorer, never the last live branch, and only when
the engine sends token logprobs."""

from __future__ import annotations

import asyncio
import uuid

import msgspec

from cascade.branches.backend import GenerationRequest
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.runner import BranchRun, BranchRunner, BranchSettings
from cascade.config import Timeouts
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript

ANSWER = "[fake answer=3_*_6_=_18.|So_the_answer_is_18.|####_18 itl_ms=10]"
PRUNING = BranchSettings(n=3, m=2, prune_confidence=0.5, confidence_group=4)


def run(settings: BranchSettings, directives: str, logprobs: bool = True, top_k: int = 0
        ) -> tuple[BranchRun, FakeEngine]:
    """Run `settings`' branches on the fake engine; `top_k`: ask for that many candidates per token, as the gateway
    does for `confidence_top_k`."""
    fake = FakeEngine(FakeScript())
    extra: dict[str, object] = {"logprobs": True} if logprobs else {}
    if top_k:
        extra["top_logprobs"] = top_k
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


# --- DeepConf online: the first wave is the warm-up, its confidence the later branches' stopping level ---------------

OTHER = "[fake@seed=1 answer=3_*_6_=_17.|So_the_answer_is_17.|####_17]"  # the first wave disagrees: a second starts
DEEPCONF = BranchSettings(n=4, m=4, first_wave=2, confidence_keep=0.9, confidence_group=4, confidence_top_k=5)


def with_top_k(settings: BranchSettings, directives: str) -> BranchRun:
    return run(settings, directives, top_k=5)[0]


def test_a_later_branch_less_sure_than_the_first_wave_is_stopped_and_the_sure_one_votes() -> None:
    result = with_top_k(DEEPCONF, f"{OTHER} [fake@seed=3 logprob=-3]")
    report = result.report
    assert report.waves == 2 and report.launched == 4
    assert report.pruned_confidence == 1 and dict(enumerate(s for _, s in result.branch_texts))[3] == "pruned"
    assert report.finished == 3 and report.votes == {"18": 2, "17": 1} and report.answer == "18"


def test_an_equally_sure_second_wave_runs_to_its_end() -> None:
    result = with_top_k(DEEPCONF, OTHER)
    assert result.report.pruned_confidence == 0 and result.report.finished == 4


def test_without_the_learned_stop_the_unsure_branch_finishes() -> None:
    off = msgspec.structs.replace(DEEPCONF, confidence_keep=0.0)
    result = with_top_k(off, f"{OTHER} [fake@seed=3 logprob=-3]")
    assert result.report.pruned_confidence == 0 and result.report.finished == 4


def test_the_confidence_vote_lets_a_sure_minority_outvote_an_unsure_majority() -> None:
    # Branches 1 and 2 say 17, unsure; 0 and 3 say 18, sure, and so do ... only two: weighted 18 wins 2 sure votes
    # against 2 unsure, where a count would tie and fall to the tie-break.
    unsure_17 = ("[fake@seed=1 answer=3_*_6_=_17.|So_the_answer_is_17.|####_17 logprob=-3] "
                 "[fake@seed=2 answer=3_*_6_=_17.|So_the_answer_is_17.|####_17 logprob=-3] "
                 "[fake@seed=4 answer=3_*_6_=_17.|So_the_answer_is_17.|####_17 logprob=-3]")
    settings = BranchSettings(n=5, m=5, confidence_group=4, confidence_top_k=5)
    counted = with_top_k(settings, unsure_17)
    weighted = with_top_k(msgspec.structs.replace(settings, aggregation="confidence"), unsure_17)
    filtered = with_top_k(msgspec.structs.replace(settings, vote_keep=0.4), unsure_17)
    assert counted.report.answer == "17" and counted.report.votes == {"18": 2, "17": 3}
    assert weighted.report.answer == "18" and filtered.report.answer == "18"
