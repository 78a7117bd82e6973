"""Load-reactive routing with the engines' own load (cascade/router/load.py `EngineView`): what the engines report
makes a tier full or pressed whoever sent the load, and without a view the gateway's own counters decide."""

from __future__ import annotations

import pytest

from cascade.config import LoadReactiveConfig, decode_config
from cascade.errors import ConfigError
from cascade.router.load import EngineView, Headroom, StaticLoad
from cascade.router.policy import QualityHint
from cascade.schemas import Degradation
from tests.router.test_load import NAMES, TIER, Clock, route, router


def room(config: LoadReactiveConfig, views: list[EngineView | None], load: list[int], capacity: list[int | None],
         streams: list[int] | None = None) -> tuple[Headroom, Clock]:
    clock = Clock()
    return Headroom(NAMES, config, capacity, StaticLoad(load, views), clock, streams=streams), clock


def test_a_tier_whose_engines_queue_is_full_though_this_gateway_sent_nothing() -> None:
    views: list[EngineView | None] = [None, EngineView(running=8, queued=3, saturated=True), None]
    headroom, _ = room(LoadReactiveConfig(enabled=True), views, [0, 0, 0], [None, None, None])
    assert headroom.hot(1) == "its engines queue 3 requests (8 running)"
    views[1] = EngineView(running=8, queued=0, saturated=False)
    assert headroom.hot(1) is None


def test_engines_holding_the_tiers_capacity_times_its_branches_make_it_full() -> None:
    views: list[EngineView | None] = [None, EngineView(running=11, queued=0, saturated=False), None]
    headroom, _ = room(LoadReactiveConfig(enabled=True), views, [0, 1, 0], [None, 4, None], streams=[1, 3, 1])
    assert headroom.hot(1) is None  # 11 engine requests of 4 x 3
    views[1] = EngineView(running=12, queued=0, saturated=False)
    assert headroom.hot(1) == "its engines hold 12 requests of 12"


def test_without_an_engine_view_the_gateways_own_counters_decide() -> None:
    load = [0, 3, 0]
    headroom, _ = room(LoadReactiveConfig(enabled=True), [None, None, None], load, [None, 4, None])
    assert headroom.hot(1) is None
    load[1] = 4
    assert headroom.hot(1) == "4 in flight of 4"


def test_the_gateways_own_count_still_counts_between_two_readings() -> None:
    # The engines read 1 running a moment ago; this gateway has sent 4 since: full, without waiting for a poll.
    headroom, _ = room(LoadReactiveConfig(enabled=True), [None, EngineView(running=1, queued=0, saturated=False), None],
                       [0, 4, 0], [None, 4, None])
    assert headroom.hot(1) == "4 in flight of 4"


def test_the_engines_ttft_presses_a_tier_with_the_same_hysteresis() -> None:
    config = LoadReactiveConfig(enabled=True, ttft_ms=500, enter_at=0.9, exit_at=0.5, hold_s=2.0)
    views: list[EngineView | None] = [None, EngineView(running=2, queued=0, saturated=False, ttft_s=0.6), None]
    headroom, clock = room(config, views, [0, 0, 0], [None, None, None])
    assert headroom.hot(1) == "engine ttft p90 0.60 s against the 0.50 s SLO"
    views[1] = EngineView(running=2, queued=0, saturated=False, ttft_s=0.1)
    clock.advance(1.0)
    assert headroom.state(1).pressed  # held
    clock.advance(1.5)
    assert not headroom.state(1).pressed and headroom.hot(1) is None


def test_balanced_moves_off_a_tier_whose_engines_queue() -> None:
    views: list[EngineView | None] = [None, EngineView(running=4, queued=2, saturated=True), None]
    reactive = router(LoadReactiveConfig(enabled=True), StaticLoad([0, 0, 0], views), Clock(),
                      capacity=[None, None, None])
    itinerary, degraded = route(reactive, QualityHint(name="balanced"))
    assert itinerary.first == 0 and isinstance(degraded, Degradation)
    assert (degraded.tier, degraded.reason) == ("medium", "its engines queue 2 requests (4 running)")


SGLANG_TIER = '[[tiers]]\nname = "{}"\nbackends = [{{ kind = "sglang", url = "http://127.0.0.1:1", model = "m" }}]\n'


def test_load_reactive_routing_with_nothing_but_sglang_tiers_watches_their_engines() -> None:
    config = decode_config(TIER.format("a") + SGLANG_TIER.format("b") + "[routing.load]\nenabled = true\n")
    assert config.routing.load.enabled and config.routing.engine_load.enabled
    with pytest.raises(ConfigError, match="watches nothing"):  # engine load off: nothing is watched again
        decode_config(TIER.format("a") + SGLANG_TIER.format("b") + "[routing.load]\nenabled = true\n"
                      "[routing.engine_load]\nenabled = false\n")


@pytest.mark.parametrize("engine_load", ["poll_s = 2", "poll_s = 0", "stale_after = 0", "max_queue = -1"])
def test_an_engine_load_section_out_of_bounds_is_refused_at_start(engine_load: str) -> None:
    with pytest.raises(ConfigError, match=r"routing\.engine_load"):
        decode_config(TIER.format("a") + "[routing.engine_load]\n" + engine_load)
