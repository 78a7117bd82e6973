"""`reasoning_effort` as a quality hint (cascade/router/effort.py): every value a client may send read to its level or
refused naming the field, the documented table, and the one precedence rule (explicit cascade hints, then the effort,
then the gateway's default). Client text is hostile here: long runs, unicode, numbers written every way, JSON nested
deep inside `reasoning`, numbers far past any bound."""

from __future__ import annotations

import json
import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import EffortConfig, EffortRoute
from cascade.errors import ConfigError, InvalidRequest
from cascade.router.effort import (
    SHOWN_CHARS,
    EffortTable,
    effort_hint,
    effort_use,
    parse_effort,
    pick_hint,
    read_effort,
)
from cascade.router.policy import QualityHint
from cascade.schemas import EFFORT_LEVELS, EFFORT_NUMBER_MAX, ReasoningRequest
from cascade.service.bodies import decode_chat_request

TABLE = EffortTable(EffortConfig())
FAST, BALANCED, BEST = QualityHint(name="fast"), QualityHint(name="balanced"), QualityHint(name="best")
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(("level", "hint", "branches", "thinking"), [
    ("none", FAST, 1, False), ("minimal", FAST, 1, True),  # the cheapest tier, answering directly
    ("low", FAST, 0, True), ("medium", BALANCED, 0, True),
    ("high", BEST, 0, True), ("xhigh", BEST, 0, True), ("max", BEST, 0, True), ("ultra", BEST, 0, True),
])
def test_the_default_table_maps_each_level_as_documented(level: str, hint: QualityHint, branches: int,
                                                          thinking: bool) -> None:
    asked = effort_hint(parse_effort(level), TABLE)
    assert (asked.hint, asked.branches, asked.effort.thinking, asked.effort.level) == (hint, branches, thinking, level)


def test_the_table_is_configurable_per_level() -> None:
    table = EffortTable(EffortConfig(high=EffortRoute(quality=0.8, branches=4), none=EffortRoute(quality="balanced")))
    high = effort_hint(parse_effort("high"), table)
    assert (high.hint, high.branches) == (QualityHint(target=0.8), 4)
    none = effort_hint(parse_effort("none"), table)
    assert (none.hint, none.branches, none.effort.thinking) == (BALANCED, 0, True)  # the route's own defaults


@pytest.mark.parametrize("quality", ["quick", "", 1.5, 0.0])
def test_a_table_hint_that_is_no_hint_fails_at_start_naming_its_key(quality: str | float) -> None:
    with pytest.raises(ConfigError, match=r"routing\.effort\.low\.quality"):
        EffortTable(EffortConfig(low=EffortRoute(quality=quality)))


@pytest.mark.parametrize(("value", "level"), [
    (0.0, "minimal"), (0.2499, "minimal"), (0.25, "low"), (0.49, "low"), (0.5, "medium"), (0.7499, "medium"),
    (0.75, "high"), (EFFORT_NUMBER_MAX, "high"), (0, "minimal"), ("0.5", "medium"), (" 0.8 ", "high"),
    (" HIGH ", "high"), ("Max", "max"), ("none", "none"),
])
def test_numbers_read_as_the_level_their_range_falls_in(value: str | float, level: str) -> None:
    effort = parse_effort(value)
    assert effort.level == level
    assert effort.value == (level if isinstance(value, str) and not value.strip()[0].isdigit() else float(value))


@pytest.mark.parametrize("value", [1.0, -0.01, math.inf, -math.inf, math.nan, 1e300, "1", "nan", "inf", "hgh", "",
                                   "lowest", "0x1", "1e-400x", True, "0.5" + "0" * 100])
def test_a_value_that_is_no_effort_is_a_400_naming_the_field(value: object) -> None:
    for param in ("reasoning_effort", "reasoning.effort"):
        with pytest.raises(InvalidRequest) as refused:
            parse_effort(value, param)  # type: ignore[arg-type]  # a hostile value of any type
        assert refused.value.param == param


def test_both_forms_must_agree() -> None:
    assert read_effort("high", ReasoningRequest(effort=" High")) == parse_effort("high")
    assert read_effort(None, ReasoningRequest(effort="low")) == parse_effort("low", "reasoning.effort")
    assert read_effort(None, ReasoningRequest()) is None and read_effort(None, None) is None
    with pytest.raises(InvalidRequest) as refused:
        read_effort("high", ReasoningRequest(effort=0.1))
    assert refused.value.param == "reasoning.effort"


@pytest.mark.parametrize(("body", "header", "alias", "source"), [
    (FAST, BALANCED, BEST, "quality"), (None, BALANCED, FAST, "header"), (None, None, FAST, "alias"),
    (None, None, None, "effort"),
])
def test_an_explicit_cascade_hint_beats_the_effort_which_beats_the_default(
        body: QualityHint | None, header: QualityHint | None, alias: QualityHint | None, source: str) -> None:
    asked = effort_hint(parse_effort("high"), TABLE)
    hint, picked = pick_hint(body, header, alias, asked, QualityHint(name="balanced"))
    assert picked == source and hint == (asked.hint if source == "effort" else body or header or alias)
    assert pick_hint(None, None, None, None, BALANCED) == (BALANCED, "default")


def test_the_note_says_what_the_effort_did() -> None:
    asked = effort_hint(parse_effort("none"), TABLE)
    routed = effort_use(asked, "effort", FAST)
    assert routed.branches == 1 and routed.note == \
        "`reasoning_effort` 'none': routed as quality `fast`, one branch, thinking off"
    overridden = effort_use(effort_hint(parse_effort("high"), TABLE), "header", FAST)
    assert overridden.branches == 0 and "X-Cascade-Quality header, which comes first" in overridden.note
    pinned = effort_use(asked, None, None)
    assert pinned.branches == 0 and "a tier was named, so it sets only the engine's thinking (off)" in pinned.note


# --- hostile values, through the body decoder as a client sends them -----------------------------------------------

UNITS = st.sampled_from(["high", "low", "0", ".", "5", "e", "-", "+", " ", "\u00a0", "\u0130", "ﬀ", "🙂", "\x00", "\\",
                         '"', "nan", "inf", "9" * 40])
RUN = st.tuples(UNITS, st.integers(1, 20_000)).map(lambda r: (r[0] * r[1])[: r[1] * len(r[0])])
HOSTILE_TEXT = st.one_of(st.sampled_from(EFFORT_LEVELS).map(lambda s: f"  {s.upper()} "), RUN, st.text(max_size=50))
HUGE = st.one_of(st.integers(-(10**40), 10**40), st.floats(allow_nan=False, allow_infinity=False),
                 st.sampled_from(["1e400", "-1e400", "1" * 500, "0." + "9" * 400, "4.9e-324"]))
NESTED = st.integers(1, 60).map(lambda depth: "[" * depth + '"high"' + "]" * depth)
VALUE = st.one_of(HOSTILE_TEXT.map(json.dumps), HUGE.map(lambda n: n if isinstance(n, str) else json.dumps(n)),
                  NESTED, st.sampled_from(["true", "null", "{}", '{"effort": "high"}', "[]"]))


@PROPERTY
@given(value=VALUE, nested=st.booleans())
def test_any_effort_a_client_sends_is_read_to_a_level_or_refused_naming_its_field(value: str, nested: bool) -> None:
    field = '"reasoning": {"effort": ' + value + "}" if nested else '"reasoning_effort": ' + value
    raw = ('{"model": "cascade", "messages": [{"role": "user", "content": "hi"}], ' + field + "}").encode()
    param = "reasoning.effort" if nested else "reasoning_effort"
    try:
        req = decode_chat_request(raw)
        effort = read_effort(req.reasoning_effort, req.reasoning)
    except InvalidRequest as exc:
        assert exc.param == param, (exc.param, exc.message)
        assert len(exc.message) < 400  # a client's megabyte is never echoed back
        return
    if effort is None:  # null: no effort
        assert value == "null"
        return
    assert effort.level in EFFORT_LEVELS and effort.param == param
    if isinstance(effort.value, float):
        assert 0.0 <= effort.value <= EFFORT_NUMBER_MAX


@PROPERTY
@given(depth=st.integers(2, 3_000))
def test_reasoning_nested_deep_is_refused_before_it_is_decoded(depth: int) -> None:
    inner = '{"effort": ' * depth + '"high"' + "}" * depth
    raw = ('{"model": "cascade", "messages": [{"role": "user", "content": "hi"}], "reasoning": ' + inner + "}").encode()
    with pytest.raises(InvalidRequest) as refused:
        decode_chat_request(raw)
    assert refused.value.param in (None, "reasoning.effort")  # past max_json_depth: the body; else the field


def test_a_shown_value_is_cut() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_effort("x" * 100_000)
    assert f"'{'x' * SHOWN_CHARS}'..." in refused.value.message


def test_an_effort_is_plain_data() -> None:
    effort = parse_effort(0.3)
    assert msgspec.json.decode(msgspec.json.encode(effort), type=type(effort)) == effort


# --- the table as a config file writes it ----------------------------------------------------------------------------

LADDER = '[[tiers]]\nname = "a"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:9", model = "m" }]\n'


def test_the_table_decodes_from_toml_one_level_at_a_time() -> None:
    from cascade.config import decode_config

    config = decode_config('[routing.effort]\nhigh = { quality = 0.8, branches = 4 }\n' + LADDER)
    assert config.routing.effort.high == EffortRoute(quality=0.8, branches=4)
    assert config.routing.effort.low == EffortConfig().low  # the rest keep their defaults


@pytest.mark.parametrize(("table", "message"), [
    ("high = { quality = 1.5 }", r"routing\.effort\.high\.quality"),
    ("high = { quality = \"best\", branches = 1025 }", r"routing\.effort\.high\.branches"),  # 1,024 at most
    ("extreme = { quality = \"best\" }", "extreme"),
    ("low = { branches = 1 }", "quality"),
])
def test_a_table_the_gateway_cannot_use_fails_at_start(table: str, message: str) -> None:
    from cascade.config import decode_config

    with pytest.raises(ConfigError, match=message):
        decode_config(f"[routing.effort]\n{table}\n" + LADDER)


def test_an_effort_target_the_router_cannot_meet_fails_at_start_naming_its_key() -> None:
    from cascade.config import decode_config
    from cascade.router.signals import routing_signal
    from cascade.service.chat import ChatService, ServiceConfig
    from cascade.service.metrics import GatewayMetrics
    from cascade.tiers.build import build_tiers

    # The random split with no tier accuracies refuses numeric hints (cascade/router/random_split.py).
    config = decode_config('[routing]\npolicy = "random"\n[routing.effort]\nmedium = { quality = 0.9 }\n' + LADDER
                           + LADDER.replace('"a"', '"b"'))
    signal = routing_signal(config.routing, ["a", "b"])
    with pytest.raises(ConfigError, match=r"routing\.effort\.medium\.quality"):
        ChatService(build_tiers(config, {}), ServiceConfig.of(config), GatewayMetrics(), signal=signal)
