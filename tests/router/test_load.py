"""Load-reactive operating points (cascade/router/load.py, cascade/router/router.py): pressure, hysteresis, and
which requests move."""

from __future__ import annotations

import msgspec
import pytest

from cascade.config import LoadReactiveConfig, RoutingConfig, decode_config
from cascade.errors import ConfigError
from cascade.router.escalation import CascadeMode, Itinerary
from cascade.router.load import Headroom, StaticLoad, TierLoad, TierShape, capacities
from cascade.router.policy import QualityHint
from cascade.router.router import Router
from cascade.schemas import Degradation

NAMES = ("small", "medium", "large")
MEDIUM_PROMPT = "What is 2 + 2?"  # heuristic difficulty 0.47: `balanced` routes it to tier 1 of 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def headroom(config: LoadReactiveConfig, load: list[int] | None = None, capacity: list[int | None] | None = None
             ) -> tuple[Headroom, Clock, list[int]]:
    clock = Clock()
    live = load if load is not None else [0, 0, 0]
    return Headroom(NAMES, config, capacity or [None, 4, None], StaticLoad(live), clock), clock, live


def test_a_full_tier_is_read_live_and_only_while_its_requests_in_flight_reach_its_capacity() -> None:
    room, _, load = headroom(LoadReactiveConfig(enabled=True))
    load[1] = 3
    assert room.hot(1) is None
    load[1] = 4
    assert room.hot(1) == "4 in flight of 4"  # no refresh interval, no hold: the next request sees it
    load[1] = 3
    assert room.hot(1) is None and room.hot(0) is None  # tier 0 has no capacity: its load is not watched


def test_a_tier_is_pressed_from_enter_at_and_freed_only_below_exit_at_after_the_hold() -> None:
    config = LoadReactiveConfig(enabled=True, e2el_ms=1000, percentile=50, window_s=1, min_samples=1, enter_at=0.9,
                        exit_at=0.5, hold_s=5.0)
    room, clock, _ = headroom(config)

    def answered(seconds: float, after_s: float = 1.0) -> None:
        clock.advance(after_s)
        room.observe_e2el(1, seconds)
        clock.advance(0.5)

    answered(0.8)  # 0.8 of the SLO: not yet
    assert not room.state(1).pressed
    answered(0.95)
    assert room.state(1).pressed and room.hot(1) == "e2el p50 0.95 s against the 1.00 s SLO"
    for _ in range(8):  # between exit_at and enter_at: stays pressed, however long
        answered(0.7)
        assert room.state(1).pressed
    answered(0.3, after_s=2.0)  # below exit_at, and the last hot moment was > hold_s ago: freed
    assert not room.state(1).pressed
    answered(1.0, after_s=2.0)
    assert room.state(1).pressed
    answered(0.2, after_s=2.0)  # below exit_at 2.5 s after the last hot moment: the hold keeps it (no flapping)
    assert room.state(1).pressed
    answered(0.2, after_s=3.0)
    assert not room.state(1).pressed and room.state(1).pressure == 0.2


def test_latency_pressure_needs_min_samples_and_forgets_answers_older_than_the_window() -> None:
    config = LoadReactiveConfig(enabled=True, e2el_ms=1000, percentile=50, window_s=10, min_samples=3, hold_s=1)
    room, clock, _ = headroom(config)
    room.observe_e2el(2, 1.5)
    room.observe_e2el(2, 1.5)
    clock.advance(1)
    assert not room.state(2).pressed  # two answers are not evidence yet
    room.observe_e2el(2, 0.9)
    clock.advance(1)
    state = room.state(2)
    assert state.pressed and state.pressure == 1.5 and state.why.startswith("e2el p50 1.50 s against the 1.00 s SLO")
    clock.advance(11)  # the slow answers leave the window: no evidence, no pressure
    assert not room.state(2).pressed


def test_ttft_pressure_compares_the_percentile_with_the_ttft_slo() -> None:
    room, clock, _ = headroom(LoadReactiveConfig(enabled=True, ttft_ms=200, percentile=90, min_samples=5))
    for seconds in (0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.5):
        room.observe_ttft(0, seconds)
    clock.advance(1)
    assert room.state(0).pressure == pytest.approx(0.095 / 0.2, abs=1e-3)  # p90 of nine fast, one slow
    assert not room.state(0).pressed


def router(config: LoadReactiveConfig, load: TierLoad, clock: Clock, mode: str = "route",
           capacity: list[int | None] | None = None) -> Router:
    """A router over NAMES whose tiers hold `capacity` requests (default: the middle tier 4)."""
    held = capacity or [None, 4, None]
    config = msgspec.structs.replace(config, max_in_flight={n: c for n, c in zip(NAMES, held, strict=True) if c})
    return Router([TierShape(n) for n in NAMES], RoutingConfig(mode=mode, load=config), load=load, clock=clock)


def route(router: Router, hint: QualityHint, text: str = MEDIUM_PROMPT) -> tuple[Itinerary, Degradation | None]:
    routing = router.itinerary(text, hint)
    return routing.itinerary, routing.degraded


def test_balanced_moves_to_fast_while_its_tier_is_pressed_and_back_when_it_is_free() -> None:
    clock, load = Clock(), [0, 0, 0]
    reactive = router(LoadReactiveConfig(enabled=True, hold_s=1.0), StaticLoad(load), clock)
    balanced = QualityHint(name="balanced")
    itinerary, degraded = route(reactive, balanced)
    assert itinerary.first == 1 and degraded is None
    load[1] = 4
    clock.advance(1)
    itinerary, degraded = route(reactive, balanced)
    assert itinerary.first == 0
    assert degraded is not None and (degraded.requested, degraded.served, degraded.tier) == ("balanced", "fast",
                                                                                              "medium")
    assert degraded.reason == "4 in flight of 4" and degraded.branches is None
    load[1] = 0
    clock.advance(2)
    itinerary, degraded = route(reactive, balanced)
    assert itinerary.first == 1 and degraded is None


def test_numeric_targets_keep_their_point_and_best_moves_only_when_configured() -> None:
    clock, load = Clock(), StaticLoad([0, 0, 4])
    full_top = [None, None, 4]
    target = QualityHint(target=0.99)  # thresholds near 0: the top tier
    assert route(router(LoadReactiveConfig(enabled=True), load, clock, capacity=full_top), target)[0].first == 2
    best = QualityHint(name="best")
    itinerary, degraded = route(router(LoadReactiveConfig(enabled=True), load, clock, capacity=full_top), best)
    assert itinerary.first == 2 and degraded is None
    itinerary, degraded = route(router(LoadReactiveConfig(enabled=True, degrade_best=True), load, clock,
                                       capacity=full_top), best)
    assert itinerary.first == 1 and degraded is not None and degraded.served == "balanced"


def test_a_request_stays_put_when_every_cheaper_point_loads_a_pressed_tier_too() -> None:
    reactive = router(LoadReactiveConfig(enabled=True), StaticLoad([4, 4, 0]), Clock(), capacity=[4, 4, None])
    itinerary, degraded = route(reactive, QualityHint(name="balanced"))
    assert itinerary.first == 1 and degraded is None


def test_disabled_moves_nothing() -> None:
    reactive = router(LoadReactiveConfig(enabled=False), StaticLoad([0, 4, 0]), Clock())
    assert reactive.headroom is None
    itinerary, degraded = route(reactive, QualityHint(name="balanced"))
    assert itinerary.first == 1 and degraded is None


def test_cascade_mode_lowers_acceptance_while_an_escalation_target_is_pressed() -> None:
    reactive = router(LoadReactiveConfig(enabled=True), StaticLoad([0, 0, 4]), Clock(), "cascade",
                      capacity=[None, None, 4])
    itinerary, degraded = route(reactive, QualityHint(name="balanced"))
    assert degraded is not None and degraded.served == "fast" and degraded.tier == "large"
    balanced = CascadeMode(3).accept(QualityHint(name="balanced"))
    assert itinerary.thresholds is not None and itinerary.thresholds != balanced


def test_a_pressed_reasoning_tier_runs_only_the_branches_that_must_finish() -> None:
    # Tiers 0 and 1 full: no cheaper point helps, so `balanced` stays on tier 1 and runs only its M branches there.
    clock, load = Clock(), [0, 0, 0]
    reactive = router(LoadReactiveConfig(enabled=True), StaticLoad(load), clock, capacity=[4, 4, None])
    balanced = QualityHint(name="balanced")
    assert reactive.itinerary(MEDIUM_PROMPT, balanced).shed({1: (4, 2)}) == ({}, None)
    load[0] = load[1] = 4
    clock.advance(1)
    cut, degraded = reactive.itinerary(MEDIUM_PROMPT, balanced).shed({1: (4, 2)})
    assert cut == {1: 2} and degraded is not None and degraded.branches == 2 and degraded.served == "balanced"
    assert degraded.tier == "medium" and degraded.reason == "4 in flight of 4"
    assert reactive.itinerary(MEDIUM_PROMPT, balanced).shed({1: (2, 2)}) == ({}, None)  # nothing to shed
    assert reactive.itinerary(MEDIUM_PROMPT, QualityHint(target=0.5)).shed({1: (4, 2)}) == ({}, None)  # numeric
    unshed = router(LoadReactiveConfig(enabled=True, shed_branches=False), StaticLoad(load), clock,
                    capacity=[4, 4, None])
    assert unshed.itinerary(MEDIUM_PROMPT, balanced).shed({1: (4, 2)}) == ({}, None)


def test_capacity_is_the_configured_limit_else_what_the_branch_slots_hold() -> None:
    config = LoadReactiveConfig(max_in_flight={"a": 3})
    assert capacities(config, [TierShape("a", 16, 4), TierShape("b", 16, 4), TierShape("c")]) == [3, 4, None]


TIER = '[[tiers]]\nname = "{}"\nbackends = [{{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }}]\n'


@pytest.mark.parametrize(("load", "message"), [
    ("enabled = true\nttft_ms = 100\nexit_at = 0.9", "must be below `enter_at`"),
    ("max_in_flight = { nope = 2 }", r"names \['nope'\], which are not tiers"),
    ("enabled = true", "watches nothing"),
])
def test_a_load_section_that_cannot_work_is_refused_at_start(load: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        decode_config(TIER.format("a") + TIER.format("b") + "[routing.load]\n" + load)
