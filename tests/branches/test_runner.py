"""The SART branch runner against the fake engine over real HTTP: early stop, two-phase pruning, votes.

One fake engine plays every branch: `[fake@seed=N ...]` scripts the branch with seed N (the runner's
requests carry seeds 0..N-1), `|` in an answer is a paragraph break (a reasoning step).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import pytest

from cascade.branches.backend import GenerationRequest
from cascade.branches.cpu_scorer import CPUScorer
from cascade.branches.openai_client import OpenAIBackend
from cascade.branches.runner import BranchRun, BranchRunner, BranchSettings
from cascade.config import Timeouts
from cascade.errors import BackendError
from cascade.schemas import ChatMessage
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.waiting import eventually

RIGHT = "3_*_6_=_18.|So_the_answer_is_18.|####_18"
WRONG = "3_*_6_=_19.|So_the_answer_is_19.|####_19"
LOOPING = "|".join(["2_+_2_=_5."] * 40)


@pytest.fixture
def engine() -> Iterator[tuple[str, FakeEngine]]:
    fake = FakeEngine(FakeScript(tokens=8))
    with serve_asgi(fake) as url:
        yield url, fake


def run(url: str, settings: BranchSettings, directives: str, scorer: CPUScorer | None = None) -> BranchRun:
    requests = [
        GenerationRequest(messages=[ChatMessage(role="user", content=f"Q {directives}")], max_tokens=400,
                          temperature=0.7, seed=i, request_id=f"branch-{uuid.uuid4().hex}")
        for i in range(settings.n)
    ]

    async def go() -> BranchRun:
        backend = OpenAIBackend("fake", url, "fake-model", Timeouts(connect_s=1, read_s=5, total_s=20))
        try:
            return await BranchRunner(backend, settings, scorer).run("Q", requests)
        finally:
            await backend.aclose()

    return asyncio.run(go())


def quiet(url: str) -> bool:
    return httpx.get(f"{url}/fake/stats", timeout=5).json()["in_flight"] == 0


def test_early_stop_cancels_the_branches_still_running_once_m_finished(engine) -> None:
    url, fake = engine
    slow = "ttft_ms=0 itl_ms=50 tokens=400"
    directives = f"[fake answer={RIGHT}] [fake@seed=2 {slow}] [fake@seed=3 {slow}]"
    result = run(url, BranchSettings(n=4, m=2), directives)
    report = result.report
    assert (report.launched, report.finished, report.early_stopped) == (4, 2, 2)
    assert report.answer == "18" and result.text.endswith("#### 18")
    assert eventually(lambda: quiet(url)) and fake.stats.streams_cancelled == 2
    assert fake.stats.tokens_sent < 2 * 400  # the slow branches did not run to their end


def test_majority_vote_wins_over_a_single_dissenting_branch(engine) -> None:
    url, _ = engine
    directives = f"[fake answer={RIGHT}] [fake@seed=1 answer={WRONG}]"
    result = run(url, BranchSettings(n=3, m=3), directives)
    assert result.report.answer == "18" and result.report.votes == {"18": 2, "19": 1}
    assert result.report.chosen in (0, 2)


def test_phase_one_prunes_a_branch_scoring_below_alpha_at_most_beta_times(engine) -> None:
    url, fake = engine
    # The right branches start late, so the looping ones are scored before anything finishes.
    directives = (f"[fake answer={RIGHT} ttft_ms=400] [fake@seed=2 answer={LOOPING} ttft_ms=0 itl_ms=5] "
                  f"[fake@seed=3 answer={LOOPING} ttft_ms=0 itl_ms=5]")
    settings = BranchSettings(n=4, m=2, alpha=0.3, beta=1, k=1)
    result = run(url, settings, directives, CPUScorer())
    report = result.report
    assert report.pruned_phase1 == 1 and report.answer == "18"
    assert report.pruned_phase1 + report.pruned_phase2 + report.early_stopped + report.finished == 4
    assert eventually(lambda: quiet(url)) and fake.stats.streams_cancelled >= 2


def test_phase_two_prunes_live_branches_scoring_below_the_first_finished_branch(engine) -> None:
    url, _ = engine
    long_right = "|".join(f"{k}_+_1_=_{k + 1}." for k in range(10)) + "|####_18"
    directives = (f"[fake answer={long_right} itl_ms=10] [fake@seed=0 answer={RIGHT} itl_ms=1] "
                  f"[fake@seed=1 answer={WRONG}|{LOOPING} itl_ms=10]")
    settings = BranchSettings(n=3, m=2, alpha=0.0, k=1)
    result = run(url, settings, directives, CPUScorer())
    report = result.report
    assert report.pruned_phase1 == 0 and report.pruned_phase2 == 1 and report.finished == 2
    assert report.answer == "18" and report.scores_computed > 0
    assert eventually(lambda: quiet(url))


def test_weighted_vote_follows_the_scores(engine) -> None:
    url, _ = engine
    # Two branches agree on 19 but their arithmetic is wrong; one right branch scores higher.
    directives = f"[fake answer={WRONG}|{WRONG}] [fake@seed=0 answer={RIGHT}]"
    settings = BranchSettings(n=3, m=3, alpha=0.0, aggregation="weighted", k=100)
    majority = run(url, BranchSettings(n=3, m=3), directives)
    weighted = run(url, settings, directives, CPUScorer())
    assert majority.report.answer == "19"
    assert weighted.report.votes == {"18": 1, "19": 2}
    scores = CPUScorer()
    right = scores.score_steps(["3 * 6 = 18.", "So the answer is 18.", "#### 18"])
    wrong = scores.score_steps(["3 * 6 = 19.", "So the answer is 19.", "#### 19"] * 2)
    assert (weighted.report.answer == "18") == (right > 2 * wrong)


def test_a_request_whose_branches_all_fail_raises_the_backend_error(engine) -> None:
    url, _ = engine
    with pytest.raises(BackendError):
        run(url, BranchSettings(n=3, m=2), "[fake status=500]")


def test_one_failing_branch_does_not_fail_the_request(engine) -> None:
    url, _ = engine
    result = run(url, BranchSettings(n=3, m=2), f"[fake answer={RIGHT}] [fake@seed=1 status=500]")
    assert result.report.failed == 1 and result.report.finished == 2 and result.report.answer == "18"


def test_m_above_n_is_refused() -> None:
    with pytest.raises(ValueError, match="`m` must be between 1 and n"):
        BranchRunner(OpenAIBackend("x", "http://127.0.0.1:9", "m"), BranchSettings(n=2, m=3))


class _SlowCloseBackend:
    """Branch seed 0 answers at once; the others stream forever. Closing a stream takes a moment (an
    upstream abort), and each close is recorded, so the test can see when slots are handed back."""

    name = "slow-close"

    def __init__(self) -> None:
        self.closed = 0

    async def stream(self, request: GenerationRequest):  # type: ignore[no-untyped-def]
        from cascade.branches.backend import StreamDelta

        try:
            if request.seed == 0:
                yield StreamDelta(text="3 * 6 = 18.\n\n#### 18", finish_reason="stop")
                return
            while True:
                yield StreamDelta(text="thinking ")
                await asyncio.sleep(0.01)
        finally:
            await asyncio.sleep(0.05)
            self.closed += 1


def test_a_branch_hands_its_slot_back_only_once_its_upstream_stream_is_closed() -> None:
    backend = _SlowCloseBackend()
    seen_at_end: list[int] = []  # closed streams at each slot hand-back
    requests = [GenerationRequest(messages=[ChatMessage(role="user", content="Q")], max_tokens=400, seed=i)
                for i in range(3)]
    result = asyncio.run(BranchRunner(backend, BranchSettings(n=3, m=1), None).run(  # type: ignore[arg-type]
        "Q", requests, lambda: seen_at_end.append(backend.closed)))
    assert result.report.answer == "18" and result.report.early_stopped == 2
    # Three hand-backs, each after (never before) a stream was closed: a waiting request admitted into a
    # freed slot cannot overlap the stopped branch upstream.
    assert len(seen_at_end) == 3 and all(closed >= k + 1 for k, closed in enumerate(seen_at_end)), seen_at_end


def test_a_first_wave_that_agrees_answers_and_the_other_branches_never_start(engine) -> None:
    url, fake = engine
    result = run(url, BranchSettings(n=8, m=8, first_wave=2), f"[fake answer={RIGHT}]")
    report = result.report
    assert (report.launched, report.finished, report.waves, report.early_stopped) == (2, 2, 1, 0)
    assert report.answer == "18" and report.votes == {"18": 2}
    assert fake.stats.streams_started == 2 and len(result.branch_texts) == 2
    assert report.decode_tokens == 2 * result.completion_tokens > 0  # two identical branches, nothing else


def test_a_first_wave_that_disagrees_launches_the_rest_and_all_of_them_vote(engine) -> None:
    url, fake = engine
    # Seed 1 dissents in the first wave; the second wave (seeds 2-5) sides with seed 0.
    directives = f"[fake answer={RIGHT}] [fake@seed=1 answer={WRONG}] [fake@seed=2 answer={WRONG}]"
    result = run(url, BranchSettings(n=6, m=6, first_wave=2), directives)
    report = result.report
    assert (report.launched, report.finished, report.waves) == (6, 6, 2)
    assert report.votes == {"18": 4, "19": 2} and report.answer == "18"
    assert fake.stats.streams_started == 6


def test_a_first_wave_branch_cut_by_max_tokens_is_no_agreement(engine) -> None:
    url, _ = engine
    # Seed 1 runs past max_tokens: its answer is incomplete, so the wave cannot stand on it even if it agrees.
    cut = "|".join(["3_*_6_=_18."] * 150)  # past the 400 max_tokens: ends with finish_reason "length"
    directives = f"[fake answer={RIGHT}] [fake@seed=1 answer={cut}]"
    result = run(url, BranchSettings(n=4, m=3, first_wave=2), directives)
    assert result.report.waves == 2 and result.report.launched == 4


def test_waves_with_a_margin_double_until_one_answer_leads_by_it(engine) -> None:
    url, fake = engine
    # Waves of 2, 4, 8 with margin 2: seed 1 dissents (1-1), seeds 2 and 3 side with seed 0 (3-1): settled at 4.
    directives = f"[fake answer={RIGHT}] [fake@seed=1 answer={WRONG}]"
    result = run(url, BranchSettings(n=8, m=8, first_wave=2, wave_margin=2), directives)
    report = result.report
    assert (report.launched, report.finished, report.waves) == (4, 4, 2)
    assert report.votes == {"18": 3, "19": 1} and fake.stats.streams_started == 4
    # Seeds 1 and 3 dissent: 2-2 at four, so the last wave runs all eight (6-2).
    directives += f" [fake@seed=3 answer={WRONG}]"
    result = run(url, BranchSettings(n=8, m=8, first_wave=2, wave_margin=2), directives)
    assert (result.report.launched, result.report.waves, result.report.votes) == (8, 3, {"18": 6, "19": 2})


def test_a_wave_margin_needs_a_first_wave() -> None:
    with pytest.raises(ValueError, match="`wave_margin` needs first_wave"):
        BranchRunner(None, BranchSettings(n=8, m=8, wave_margin=2))  # type: ignore[arg-type]


@pytest.mark.parametrize("first_wave, m", [(1, 4), (4, 4), (5, 4)])
def test_a_first_wave_needs_two_branches_and_room_below_m(first_wave: int, m: int) -> None:
    with pytest.raises(ValueError, match="`first_wave` must be 0"):
        BranchRunner(None, BranchSettings(n=8, m=m, first_wave=first_wave))  # type: ignore[arg-type]
