"""The bounds on the request fields of issue 65 item 4 (`stop_token_ids`, `min_tokens`, `service_tier`), what a request
drops (cascade/service/dropped.py) and which model ids `GET /v1/models/{id}` serves (cascade/service/model_ids.py),
each as a property over an attacker's values: long lists, huge numbers, long and odd text."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cascade.config import Limits
from cascade.errors import InvalidRequest, UnknownModel
from cascade.schemas import MAX_TOKEN_ID, OPENAI_ONLY, SERVICE_TIER_CHARS, ChatCompletionRequest, ModelCard, ModelList
from cascade.service.bodies import decode_chat_request
from cascade.service.dropped import DROPPED_HEADER, dropped, dropped_headers
from cascade.service.model_ids import MAX_MODEL_ID_CHARS, model_card
from cascade.service.validation import validate

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.data_too_large])
LIMITS = Limits()
HUGE = st.one_of(st.integers(-(2**80), 2**80), st.sampled_from([0, MAX_TOKEN_ID, MAX_TOKEN_ID + 1, -1, 2**63, 10**25]))
ODD_TEXT = st.one_of(st.text(max_size=80), st.tuples(st.sampled_from(["x", " ", "\u202e", "\x00", "/", "%", ":"]),
                                                      st.integers(1, 20_000)).map(lambda r: r[0] * r[1]))


def refused(**fields: object) -> str | None:
    """The parameter `validate` names for a request with `fields` (decoded from JSON, as the gateway does)."""
    body = json.dumps({"model": "cascade", "messages": [{"role": "user", "content": "Q"}], **fields}).encode()
    try:
        validate(decode_chat_request(body), LIMITS)
    except InvalidRequest as exc:
        return exc.param
    return None


@PROPERTY
@given(st.one_of(st.lists(HUGE, max_size=80), st.integers(0, 100_000).map(lambda n: list(range(n)))))
@example(list(range(LIMITS.max_stop_token_ids)))
@example([0] * (LIMITS.max_stop_token_ids + 1))
def test_stop_token_ids_pass_within_their_count_and_range_and_are_refused_by_name_past_either(ids: list[int]) -> None:
    fits = len(ids) <= LIMITS.max_stop_token_ids and all(0 <= i <= MAX_TOKEN_ID for i in ids)
    param = refused(stop_token_ids=ids)
    assert param is None if fits else param is not None and param.startswith("stop_token_ids"), param


@PROPERTY
@given(st.lists(st.one_of(st.integers(0, MAX_TOKEN_ID), st.integers(0, MAX_TOKEN_ID).map(float)), max_size=32))
@example([5.0, 7, 9.0])
def test_stop_token_ids_given_as_whole_floats_are_read_as_those_ints(ids: list[float]) -> None:
    # JSON Schema's "integer" includes 5.0 (and OpenAI's clients send it); a fraction stays refused by name
    body = json.dumps({"model": "cascade", "messages": [{"role": "user", "content": "Q"}], "stop_token_ids": ids})
    req = decode_chat_request(body.encode())
    assert req.stop_token_ids == [int(i) for i in ids] and all(type(i) is int for i in req.stop_token_ids)
    assert refused(stop_token_ids=[*ids, 2.5]) == f"stop_token_ids[{len(ids)}]"


@PROPERTY
@given(HUGE, st.one_of(st.none(), st.integers(-5, 2 * LIMITS.max_tokens)))
@example(LIMITS.max_tokens, None)
@example(LIMITS.max_tokens + 1, None)
@example(9, 8)
def test_min_tokens_passes_from_0_to_the_token_limit(min_tokens: int, limit: int | None) -> None:
    fields: dict[str, object] = {"min_tokens": min_tokens}
    if limit is not None:
        fields["max_completion_tokens"] = limit
    param = refused(**fields)
    if limit is not None and not 1 <= limit <= LIMITS.max_tokens:
        assert param == "max_completion_tokens"
    elif 0 <= min_tokens <= (limit or LIMITS.max_tokens):
        assert param is None
    else:  # a number past what msgspec decodes is refused by name too
        assert param == "min_tokens"


@PROPERTY
@given(ODD_TEXT)
@example("a" * SERVICE_TIER_CHARS)
@example("a" * (SERVICE_TIER_CHARS + 1))
def test_service_tier_is_any_short_text_and_refused_by_name_past_its_length(tier: str) -> None:
    assert refused(service_tier=tier) == (None if len(tier) <= SERVICE_TIER_CHARS else "service_tier")


@pytest.mark.parametrize(("fields", "param"), [
    ({"verbosity": "loud"}, "verbosity"), ({"store": "yes"}, "store"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"skip_special_tokens": "false"}, "skip_special_tokens"), ({"min_tokens": 1.5}, "min_tokens"),
    ({"stream": True, "stream_options": {"include_obfuscation": "no"}}, "stream_options.include_obfuscation"),
])
def test_a_new_field_of_the_wrong_type_is_refused_by_name(fields: dict[str, object], param: str) -> None:
    assert refused(**fields) == param


@given(st.fixed_dictionaries({}, optional={name.rpartition(".")[2]: st.sampled_from([*served, "flex", True, "low"])
                                           for name, served in OPENAI_ONLY.items()}))
@settings(max_examples=60, deadline=None)
def test_openais_own_fields_are_dropped_unless_served_as_asked_and_the_header_lists_them(
        fields: dict[str, object]) -> None:
    options = {"include_obfuscation": fields.pop("include_obfuscation")} if "include_obfuscation" in fields else None
    try:
        req = msgspec.convert({"model": "cascade", "messages": [{"role": "user", "content": "Q"}], "stream": True,
                               "stream_options": options, **fields}, ChatCompletionRequest)
    except msgspec.ValidationError:
        return  # a value of the wrong type: a 400 before this
    expected = [name for name, served in OPENAI_ONLY.items()
                if (value := {**fields, **(options or {})}.get(name.rpartition(".")[2])) is not None
                and value not in served]
    found = dropped(req, [])
    assert list(found.names) == expected
    assert (found.note is None) == (not expected) and all(f"`{name}`" in (found.note or "") for name in expected)
    assert dropped_headers(found.names) == ([(DROPPED_HEADER, ",".join(expected).encode())] if expected else [])


SERVED = ModelList(data=[ModelCard(id=i) for i in ("cascade", "cascade:fast", "cascade:best", "small", "a/b:c")])


@PROPERTY
@given(ODD_TEXT)
@example("cascade:0.5")
@example("cascade:" + "9" * 10_000)
@example("a/b:c")
def test_any_model_id_is_a_served_one_or_model_not_found_with_a_short_message(model_id: str) -> None:
    try:
        card = model_card(model_id, SERVED)
    except UnknownModel as exc:
        assert len(exc.message) < 500 and model_id not in {c.id for c in SERVED.data}
        return
    assert card.id == model_id and len(model_id) <= MAX_MODEL_ID_CHARS
    assert model_id in {c.id for c in SERVED.data} or model_id.startswith("cascade:")
