"""Load-reactive operating points (cascade/router/load.py): pressure, hysteresis, and which requests move."""

from __future__ import annotations

import pytest

from cascade.config import LoadReactiveConfig, decode_config
from cascade.errors import ConfigError
from cascade.router.escalation import CascadeMode, Itinerary, RouteMode
from cascade.router.load import Headroom, LoadReactive, capacities
from cascade.router.policy import QualityHint, RoutingPolicy

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
    return Headroom(NAMES, config, capacity or [None, 4, None], lambda i: live[i], clock), clock, live


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


def routing(mode: str = "route") -> tuple[RoutingPolicy, RouteMode | CascadeMode]:
    return RoutingPolicy(3), RouteMode(3) if mode == "route" else CascadeMode(3)


def adjust(policy_mode: tuple[RoutingPolicy, RouteMode | CascadeMode], load: LoadReactive, hint: QualityHint,
           text: str = MEDIUM_PROMPT) -> tuple[Itinerary, object]:
    policy, mode = policy_mode
    route = policy.route(text, hint)
    return load.adjust(hint, mode.itinerary(route, hint),
                       lambda other: mode.itinerary(policy.reroute(route, other), other))


def test_balanced_moves_to_fast_while_its_tier_is_pressed_and_back_when_it_is_free() -> None:
    config = LoadReactiveConfig(enabled=True, hold_s=1.0)
    room, clock, load = headroom(config)
    reactive = LoadReactive(config, room)
    balanced = QualityHint(name="balanced")
    itinerary, degraded = adjust(routing(), reactive, balanced)
    assert itinerary.first == 1 and degraded is None
    load[1] = 4
    clock.advance(1)
    itinerary, degraded = adjust(routing(), reactive, balanced)
    assert itinerary.first == 0
    assert degraded is not None and (degraded.requested, degraded.served, degraded.tier) == ("balanced", "fast",
                                                                                              "medium")
    assert degraded.reason == "4 in flight of 4" and degraded.branches is None
    load[1] = 0
    clock.advance(2)
    itinerary, degraded = adjust(routing(), reactive, balanced)
    assert itinerary.first == 1 and degraded is None


def test_numeric_targets_keep_their_point_and_best_moves_only_when_configured() -> None:
    room, clock, load = headroom(LoadReactiveConfig(enabled=True), capacity=[None, None, 4])
    load[2] = 4
    clock.advance(1)
    target = QualityHint(target=0.99)  # thresholds near 0: the top tier
    assert adjust(routing(), LoadReactive(LoadReactiveConfig(enabled=True), room), target)[0].first == 2
    best = QualityHint(name="best")
    itinerary, degraded = adjust(routing(), LoadReactive(LoadReactiveConfig(enabled=True), room), best)
    assert itinerary.first == 2 and degraded is None
    itinerary, degraded = adjust(routing(), LoadReactive(LoadReactiveConfig(enabled=True, degrade_best=True), room), best)
    assert itinerary.first == 1 and degraded is not None and degraded.served == "balanced"


def test_a_request_stays_put_when_every_cheaper_point_loads_a_pressed_tier_too() -> None:
    room, clock, load = headroom(LoadReactiveConfig(enabled=True), capacity=[4, 4, None])
    load[0] = load[1] = 4
    clock.advance(1)
    itinerary, degraded = adjust(routing(), LoadReactive(LoadReactiveConfig(enabled=True), room), QualityHint(name="balanced"))
    assert itinerary.first == 1 and degraded is None


def test_disabled_moves_nothing() -> None:
    room, clock, load = headroom(LoadReactiveConfig(enabled=False))
    load[1] = 4
    clock.advance(1)
    itinerary, degraded = adjust(routing(), LoadReactive(LoadReactiveConfig(enabled=False), room), QualityHint(name="balanced"))
    assert itinerary.first == 1 and degraded is None


def test_cascade_mode_lowers_acceptance_while_an_escalation_target_is_pressed() -> None:
    config = LoadReactiveConfig(enabled=True)
    room, clock, load = headroom(config, capacity=[None, None, 4])
    load[2] = 4
    clock.advance(1)
    itinerary, degraded = adjust(routing("cascade"), LoadReactive(config, room), QualityHint(name="balanced"))
    assert degraded is not None and degraded.served == "fast" and degraded.tier == "large"
    balanced = CascadeMode(3).accept(QualityHint(name="balanced"))
    assert itinerary.thresholds is not None and itinerary.thresholds != balanced


def test_a_pressed_reasoning_tier_runs_only_the_branches_that_must_finish() -> None:
    config = LoadReactiveConfig(enabled=True)
    room, clock, load = headroom(config)
    reactive = LoadReactive(config, room)
    assert reactive.branches(QualityHint(name="balanced"), 1, n=4, m=2) is None
    load[1] = 4
    clock.advance(1)
    cut = reactive.branches(QualityHint(name="balanced"), 1, n=4, m=2)
    assert cut is not None and cut.branches == 2 and cut.served == "balanced"
    assert reactive.branches(QualityHint(target=0.5), 1, n=4, m=2) is None  # numeric: kept
    assert LoadReactive(LoadReactiveConfig(enabled=True, shed_branches=False), room).branches(
        QualityHint(name="balanced"), 1, n=4, m=2) is None


def test_capacity_is_the_configured_limit_else_what_the_branch_slots_hold() -> None:
    config = LoadReactiveConfig(max_in_flight={"a": 3})
    assert capacities(config, [("a", 16, 4), ("b", 16, 4), ("c", 0, 1)]) == [3, 4, None]


TIER = '[[tiers]]\nname = "{}"\nbackends = [{{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }}]\n'


@pytest.mark.parametrize(("load", "message"), [
    ("enabled = true\nttft_ms = 100\nexit_at = 0.9", "must be below `enter_at`"),
    ("max_in_flight = { nope = 2 }", r"names \['nope'\], which are not tiers"),
    ("enabled = true", "watches nothing"),
])
def test_a_load_section_that_cannot_work_is_refused_at_start(load: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        decode_config(TIER.format("a") + TIER.format("b") + "[routing.load]\n" + load)
