"""Route mode and cascade mode as plain data: each rule of cascade/router/escalation.py over a scripted answerer."""

from __future__ import annotations

import asyncio

import pytest

from cascade.errors import BackendFailed
from cascade.router.acceptance import NEVER, calibrated
from cascade.router.escalation import Cascaded, CascadeMode, Evidence, Pinned, Routed, RouteMode
from cascade.router.policy import Assessment, QualityHint, Route

COMPLETE = Evidence(finish_reason="stop", text="18")
CUT_OFF = Evidence(finish_reason="length", text="18")


class ScriptedAnswerer:
    """Tier i answers `answers[i]` (an Evidence), or fails when it is None; records what was asked."""

    def __init__(self, answers: list[Evidence | None], up: set[int] | None = None) -> None:
        self.answers = answers
        self.up = set(range(len(answers))) if up is None else up
        self.asked: list[int] = []
        self.moves: list[tuple[int, int, str]] = []

    async def answer(self, tier: int) -> Evidence:
        self.asked.append(tier)
        evidence = self.answers[tier]
        if evidence is None:
            raise BackendFailed(f"tier {tier} is down")
        return evidence

    def evidence(self, answer: Evidence) -> list[Evidence]:
        return [answer]

    def can_take(self, tier: int) -> bool:
        return tier in self.up

    def moved(self, from_tier: int, to_tier: int, why: str) -> None:
        self.moves.append((from_tier, to_tier, why))


def route(tier: int, p_fail: tuple[float, ...] | None = None, out_of_domain: bool = False) -> Route:
    assessment = Assessment(difficulty=0.5, score=0.5, p_fail=p_fail, out_of_domain=out_of_domain)
    return Route(tier=tier, assessment=assessment, thresholds=[0.3, 0.6], router="heuristic")


def serve(itinerary, answerer):
    return asyncio.run(itinerary.serve(answerer))


def test_a_cut_off_answer_climbs_until_a_tier_accepts() -> None:
    answerer = ScriptedAnswerer([CUT_OFF, CUT_OFF, COMPLETE])
    served = serve(Cascaded(route(0), accept=[0.5, 0.5]), answerer)
    assert (served.tier, served.escalations, served.confidence) == (2, 2, 1.0)
    assert answerer.asked == [0, 1, 2] and answerer.moves == [(0, 1, "escalated"), (1, 2, "escalated")]


def test_a_failing_tier_escalates_and_a_failing_last_tier_fails_the_request() -> None:
    answerer = ScriptedAnswerer([None, COMPLETE, COMPLETE])
    assert serve(Cascaded(route(0), accept=[0.5, 0.5]), answerer).tier == 1
    with pytest.raises(BackendFailed):
        serve(Cascaded(route(0), accept=[0.5, 0.5]), ScriptedAnswerer([None, None, None]))


def test_tiers_that_can_never_accept_are_skipped_not_run() -> None:
    answerer = ScriptedAnswerer([COMPLETE, COMPLETE, COMPLETE])
    served = serve(Cascaded(route(0), accept=[NEVER, NEVER]), answerer)
    assert served.tier == 2 and answerer.asked == [2] and served.escalations == 0


def test_the_router_prior_decides_when_the_answer_says_nothing_against_itself() -> None:
    mode = CascadeMode(3)
    unsure = mode.itinerary(route(0, p_fail=(0.8, 0.3, 0.1)), QualityHint(name="balanced"))
    answerer = ScriptedAnswerer([COMPLETE, COMPLETE, COMPLETE])
    served = serve(unsure, answerer)
    assert served.tier == 1 and served.confidence == pytest.approx(0.7)
    # Out of its domain, the learned prior is not used: any complete answer is accepted on the cheapest tier.
    outside = mode.itinerary(route(0, p_fail=(0.8, 0.3, 0.1), out_of_domain=True), QualityHint(name="balanced"))
    assert serve(outside, ScriptedAnswerer([COMPLETE, COMPLETE, COMPLETE])).tier == 0


def test_branch_agreement_beats_the_prior() -> None:
    split_vote = Evidence(finish_reason="stop", text="18", agreement=0.25)
    served = serve(Cascaded(route(0), accept=[0.5, 0.5]), ScriptedAnswerer([split_vote, COMPLETE, COMPLETE]))
    assert served.tier == 1


def test_token_confidence_beats_the_prior_and_agreement_beats_both() -> None:
    sure_prior = (0.9, 0.9, 0.9)  # the router is sure every tier answers right
    unsure_tokens = Evidence(finish_reason="stop", text="18", token_confidence=0.2)
    served = serve(Cascaded(route(0), accept=[0.5, 0.5], prior=sure_prior),
                   ScriptedAnswerer([unsure_tokens, COMPLETE, COMPLETE]))
    assert served.tier == 1 and served.escalations == 1
    agreed = Evidence(finish_reason="stop", text="18", agreement=1.0, token_confidence=0.2)
    assert serve(Cascaded(route(0), accept=[0.5, 0.5]), ScriptedAnswerer([agreed, COMPLETE, COMPLETE])).tier == 0
    sure_tokens = Evidence(finish_reason="stop", text="18", token_confidence=0.9)
    served = serve(Cascaded(route(0), accept=[0.5, 0.5], prior=(0.9, 0.9, 0.9)),
                   ScriptedAnswerer([sure_tokens, COMPLETE, COMPLETE]))
    assert served.tier == 0 and served.confidence == pytest.approx(0.9)
    cut_off = Evidence(finish_reason="length", text="18", token_confidence=0.99)  # cut off is never right as is
    assert serve(Cascaded(route(0), accept=[0.5, 0.5]), ScriptedAnswerer([cut_off, COMPLETE, COMPLETE])).tier == 1


def test_calibration_maps_raw_token_confidence_monotonically() -> None:
    assert calibrated(0.8, None) == 0.8
    assert calibrated(0.5, (1.0, 0.0)) == pytest.approx(0.5)  # the identity map
    low, high = calibrated(0.6, (4.0, -3.0)), calibrated(0.9, (4.0, -3.0))
    assert 0.0 < low < high < 1.0
    assert calibrated(0.0, (50.0, 0.0)) == pytest.approx(0.0, abs=1e-12) and calibrated(1.0, (2.0, 0.0)) > 0.999


def test_route_mode_falls_back_to_the_nearest_tier_higher_first() -> None:
    answerer = ScriptedAnswerer([COMPLETE, None, COMPLETE])
    served = serve(Routed(route(1), n_tiers=3), answerer)
    assert (served.tier, served.fallback_from) == (2, 1) and answerer.moves == [(1, 2, "fell_back")]
    answerer = ScriptedAnswerer([COMPLETE, None, COMPLETE], up={0, 1})  # tier 2 cannot take it: go down
    assert serve(Routed(route(1), n_tiers=3), answerer).tier == 0


def test_route_mode_fails_once_the_fallback_fails_too_or_without_fallback() -> None:
    with pytest.raises(BackendFailed):
        serve(Routed(route(1), n_tiers=3), ScriptedAnswerer([None, None, None]))
    answerer = ScriptedAnswerer([COMPLETE, None, COMPLETE])
    with pytest.raises(BackendFailed):
        serve(Routed(route(1), n_tiers=3, fallback=False), answerer)
    assert answerer.asked == [1]


def test_a_named_tier_answers_or_fails_never_elsewhere() -> None:
    answerer = ScriptedAnswerer([COMPLETE, None, COMPLETE])
    with pytest.raises(BackendFailed):
        serve(Pinned(1), answerer)
    assert answerer.asked == [1] and answerer.moves == []
    assert list(Pinned(1).reachable()) == [1]


def test_itineraries_say_which_tiers_a_request_may_reach_before_it_is_served() -> None:
    assert list(Cascaded(route(0), accept=[NEVER, 0.5, 0.5]).reachable()) == [1, 2, 3]
    assert list(RouteMode(3).itinerary(route(2), QualityHint(name="best")).reachable()) == [2]
    assert CascadeMode(3).itinerary(route(2), QualityHint(name="best")).first == 2
    assert CascadeMode(3).itinerary(route(0), QualityHint(target=0.9)).thresholds == [0.9, 0.9]
