"""What a request may send on to an engine (cascade/service/validation.py `engine_bounds`): each bound holds at its
default, moves with its `[gateway.limits]` key, and a request past it is refused naming the field before any tier is
asked; a request within every bound passes as sent."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from cascade.config import Limits, decode_config
from cascade.errors import ConfigError, InvalidRequest
from cascade.schemas import ChatCompletionRequest
from cascade.service.validation import validate

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def request(**fields: object) -> ChatCompletionRequest:
    return msgspec.convert({"model": "cascade", "messages": [{"role": "user", "content": "Q"}], **fields},
                           ChatCompletionRequest)


def refused(lim: Limits, **fields: object) -> str | None:
    """The parameter `validate` names for a request with `fields`, or None when it passes."""
    try:
        validate(request(**fields), lim)
    except InvalidRequest as exc:
        return exc.param
    return None


def bias(entries: int) -> dict[str, float]:
    return {str(token): -100.0 for token in range(entries)}


def metadata(pairs: int) -> dict[str, str]:
    return {f"k{i}": "v" for i in range(pairs)}


# (the Limits key, its default, the field, a value at the bound, a value one past it); the value builders take the
# bound, so that each case also holds at a bound an operator set.
BOUNDS = [
    ("max_top_logprobs", 20, "top_logprobs", lambda b: b, lambda b: b + 1),
    ("max_logit_bias", 300, "logit_bias", bias, lambda b: bias(b + 1)),
    ("max_tools", 128, "tools", lambda b: [TOOL] * b, lambda b: [TOOL] * (b + 1)),
    ("max_metadata_pairs", 16, "metadata", metadata, lambda b: metadata(b + 1)),
    ("max_metadata_key_chars", 64, "metadata", lambda b: {"k" * b: "v"}, lambda b: {"k" * (b + 1): "v"}),
    ("max_metadata_value_chars", 512, "metadata", lambda b: {"k": "v" * b}, lambda b: {"k": "v" * (b + 1)}),
    ("max_user_chars", 256, "user", lambda b: "u" * b, lambda b: "u" * (b + 1)),
    ("max_template_kwargs", 32, "chat_template_kwargs", lambda b: {f"k{i}": True for i in range(b)},
     lambda b: {f"k{i}": True for i in range(b + 1)}),
    ("max_stop_token_ids", 64, "stop_token_ids", lambda b: list(range(b)), lambda b: list(range(b + 1))),
]


@pytest.mark.parametrize(("key", "default", "field", "at", "past"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_each_bound_holds_at_its_default_and_where_an_operator_sets_it(key, default, field, at, past) -> None:
    assert getattr(Limits(), key) == default  # the number docs/operations.md gives
    for lim in (Limits(), Limits(**{key: default // 2 or 1})):
        bound = getattr(lim, key)
        assert refused(lim, **{field: at(bound)}) is None
        assert refused(lim, **{field: past(bound)}) == field


def test_tools_are_bounded_by_their_size_as_json_too() -> None:
    big = {"type": "function", "function": {"name": "f", "description": "d" * 3_000, "parameters": {}}}
    size = len(json.dumps([big] * 10, separators=(",", ":")))
    assert Limits().max_tools_bytes == 262_144
    assert refused(Limits(max_tools_bytes=size), tools=[big] * 10) is None
    assert refused(Limits(max_tools_bytes=size - 1), tools=[big] * 10) == "tools"


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("presence_penalty", [-2, 0, 2], [-2.01, 2.5]),
    ("frequency_penalty", [-2, 2], [-3, 2.01]),
    ("min_p", [0, 0.5, 1], [-0.1, 1.01]),
    ("repetition_penalty", [0.01, 1, 2], [0, -1, 2.01]),
    ("top_k", [-1, 1, 50, 2**30], [0, -2, 2**30 + 1]),
    ("top_logprobs", [0], [-1, 1_000_000_000]),
    ("min_tokens", [0, 1, 32_768], [-1, 32_769, 10**25]),
    ("stop_token_ids", [[0], [2**31 - 1], []], [[-1], [2**31], [0, 10**20]]),
])
def test_forwarded_numbers_outside_openais_and_sglangs_ranges_are_refused_by_name(field, good, bad) -> None:
    assert all(refused(Limits(), **{field: v}) is None for v in good)
    assert all(refused(Limits(), **{field: v}) == field for v in bad)


@pytest.mark.parametrize("entry", [
    {"x": 1}, {"-1": 1}, {"1.5": 1}, {"": 1}, {" 7": 1}, {"\u0661": 1},  # not a token id (Arabic-Indic digit one)
    {"1" * 10: 1}, {"0" * 10: 1},  # more digits than any vocabulary needs
    {"7": 100.5}, {"7": -101},  # beyond OpenAI's [-100, 100]
])
def test_logit_bias_keys_must_be_token_ids_and_values_within_100(entry: dict[str, float]) -> None:
    assert refused(Limits(), logit_bias=entry) == "logit_bias"
    assert refused(Limits(), logit_bias={"0": -100, "42": 100, "999999999": 0.5, "000000007": 1}) is None


def test_the_refusal_says_what_the_limit_is() -> None:
    with pytest.raises(InvalidRequest, match=r"`logit_bias` has 40000 entries; the limit is 300") as caught:
        validate(request(logit_bias=bias(40_000)), Limits())
    assert caught.value.param == "logit_bias"
    with pytest.raises(InvalidRequest, match=r"`top_logprobs` must be between 0 and 20, got 1000000000"):
        validate(request(top_logprobs=10**9), Limits())
    with pytest.raises(InvalidRequest, match=r"`tools` has 8000 entries; the limit is 128"):
        validate(request(tools=[TOOL] * 8_000), Limits())


def test_the_bounds_are_config_keys_an_operator_can_set_within_their_range() -> None:
    config = decode_config('[gateway.limits]\nmax_top_logprobs = 5\nmax_tools = 8\n'
                           '[[tiers]]\nname = "t"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]\n')
    assert (config.gateway.limits.max_top_logprobs, config.gateway.limits.max_tools) == (5, 8)
    with pytest.raises(ConfigError, match="max_top_logprobs"):
        decode_config('[gateway.limits]\nmax_top_logprobs = 1000\n'
                      '[[tiers]]\nname = "t"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]\n')


def test_the_operations_table_gives_each_bound_its_default() -> None:
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    section = text.split("## What reaches an engine", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    lim = Limits()
    for key, number in [(key, str(getattr(lim, key))) for key, *_ in BOUNDS] + [
            ("max_tools_bytes", f"{lim.max_tools_bytes // 1024} KiB"), ("max_stop_sequences", str(lim.max_stop_sequences))]:
        row = next((r for r in rows if f"`{key}`" in r), None)
        assert row is not None and re.search(rf"\b{number}\b", row), (key, number, row)
