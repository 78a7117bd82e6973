"""The upstream requests of one answer: distinct, prefix-free rids (SGLang's rules) and reproducible seeds."""

from __future__ import annotations

import re
from itertools import pairwise

import msgspec
import pytest

from cascade.branches.backend import GenerationRequest
from cascade.branches.confidence import LOGPROBS_REQUEST
from cascade.config import Limits, TierConfig
from cascade.schemas import ChatCompletionRequest, ChatMessage
from cascade.tiers import upstream

MAX_N = 128  # OpenAI's own limit on `n`, above cascade's default (Limits.max_n)
READABLE = re.compile(r"cascade-[0-9a-f]{32}-c\d{2,}-b\d{2,}")


def template(seed: int | None = 7) -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage(role="user", content="Q")], max_tokens=16, seed=seed,
                             request_id=upstream.new_base())


def rids(requests: list[GenerationRequest] | list[list[GenerationRequest]]) -> list[str]:
    flat = [r for item in requests for r in (item if isinstance(item, list) else [item])]
    return [r.request_id for r in flat]


def assert_prefix_free(values: list[str]) -> None:
    """Sorted, a string that is a prefix of another is followed by one that starts with it."""
    ordered = sorted(values)
    assert len(set(ordered)) == len(ordered), "duplicate rids"
    for shorter, longer in pairwise(ordered):
        assert not longer.startswith(shorter), (shorter, longer)


@pytest.mark.parametrize(("choices", "branches"), [
    (1, 1), (2, 12), (MAX_N, 1), (1, Limits().max_branches), (8, Limits().max_branches), (MAX_N, 32), (11, 101),
])
def test_rids_of_one_answer_are_distinct_and_none_is_a_prefix_of_another(choices: int, branches: int) -> None:
    base = template()
    requests = upstream.choice_requests(base, choices) if branches == 1 else \
        upstream.branch_requests(base, choices, branches)
    values = rids(requests)
    assert len(values) == choices * branches
    assert_prefix_free(values)
    assert base.request_id not in values  # the bare base, a prefix of all, never goes out
    assert len({len(v) for v in values}) == 1  # the construction's invariant: one length per answer


def test_rids_of_two_answers_never_prefix_each_other() -> None:
    assert_prefix_free(rids(upstream.choice_requests(template(), MAX_N)) +
                       rids(upstream.branch_requests(template(), 2, 12)) +
                       rids(upstream.branch_requests(template(), 1, 3)))


def test_rids_are_readable_with_aligned_choice_and_branch_numbers() -> None:
    base = template()
    grid = upstream.branch_requests(base, 2, 12)
    assert grid[1][7].request_id == f"{base.request_id}-c01-b07"
    assert all(READABLE.fullmatch(r) for r in rids(grid))
    assert upstream.choice_requests(base, MAX_N)[5].request_id == f"{base.request_id}-c005-b00"


def test_rid_outside_the_answer_is_refused() -> None:
    with pytest.raises(ValueError):
        upstream.rid("cascade-x", 2, 0, 2, 1)


def test_single_branch_choices_get_consecutive_seeds() -> None:
    assert [r.seed for r in upstream.choice_requests(template(seed=7), 3)] == [7, 8, 9]
    assert [r.seed for r in upstream.choice_requests(template(seed=None), 3)] == [None, None, None]


def test_branches_get_seed_plus_choice_times_n_plus_branch_and_the_branch_temperature() -> None:
    grid = upstream.branch_requests(template(seed=100), 2, 3, temperature=0.7)
    assert [[r.seed for r in row] for row in grid] == [[100, 101, 102], [103, 104, 105]]
    assert {r.temperature for row in grid for r in row} == {0.7}


def test_branches_without_a_seed_still_get_distinct_seeds() -> None:
    seeds = [r.seed for row in upstream.branch_requests(template(seed=None), 2, 4) for r in row]
    assert None not in seeds and len(set(seeds)) == 8


def test_a_tier_sends_its_instruction_first_its_default_length_and_logprobs_only_where_cascade_reads_them() -> None:
    tier = TierConfig(name="t", backends=[], system_prompt="Think.", default_max_tokens=99)
    req = msgspec.convert({"model": "cascade", "messages": [{"role": "user", "content": "Q"}], "stop": "##",
                           "seed": 3, "tools": [{"type": "function", "function": {"name": "f"}}]},
                          ChatCompletionRequest)
    sampling = upstream.sampling_of(req, 0)
    sent = upstream.template(tier, req.messages, sampling)
    assert [m.role for m in sent.messages] == ["system", "user"] and sent.messages[0].content == "Think."
    assert (sent.max_tokens, sent.stop, sent.seed) == (99, ["##"], 3) and set(sent.extra) == {"tools"}
    read = upstream.template(tier, req.messages, msgspec.structs.replace(sampling, token_logprobs=True, max_tokens=5))
    assert read.max_tokens == 5 and read.extra == {**sent.extra, **LOGPROBS_REQUEST}
    assert sent.request_id != read.request_id  # a fresh rid base per answer


@pytest.mark.parametrize(("lengths", "sent"), [
    ({}, {"max_tokens": 99, "max_completion_tokens": None}),  # the client set none: the tier's default
    ({"max_tokens": 5}, {"max_tokens": 5, "max_completion_tokens": None}),
    ({"max_completion_tokens": 7}, {"max_tokens": None, "max_completion_tokens": 7}),  # kept as the client named it
    # Both, differing: max_completion_tokens is the limit, sent under both names (an engine may read either).
    ({"max_tokens": 5, "max_completion_tokens": 7}, {"max_tokens": 7, "max_completion_tokens": 7}),
])
def test_a_client_request_for_an_engine_follows_the_tiers_rules_without_cascades_own_fields(
        lengths: dict[str, int], sent: dict[str, int | None]) -> None:
    tier = TierConfig(name="t", backends=[], system_prompt="Think.", default_max_tokens=99)
    req = msgspec.convert({"model": "cascade:best", "messages": [{"role": "user", "content": "Q"}], "quality": "best",
                           "branches": {"n": 2}, "prompt_cache_key": "k", "temperature": 0.5, **lengths},
                          ChatCompletionRequest)
    engine = upstream.engine_request(req, tier, "engine-model")
    assert engine.model == "engine-model" and engine.temperature == 0.5
    assert [(m.role, m.content) for m in engine.messages] == [("system", "Think."), ("user", "Q")]
    assert (engine.quality, engine.branches, engine.prompt_cache_key) == (None, None, None)
    assert {"max_tokens": engine.max_tokens, "max_completion_tokens": engine.max_completion_tokens} == sent
    assert upstream.template(tier, req.messages, upstream.sampling_of(req, 0)).messages == engine.messages


def test_label_decodes_a_single_branch_tier_greedily_and_leaves_branches_to_their_temperature() -> None:
    assert upstream.label_sampling(64, 0, branched=False).temperature == 0.0
    assert upstream.label_sampling(64, 0, branched=True).temperature is None


@pytest.mark.parametrize(("kwargs", "kept"), [
    ({"chat_template": "{{ x }}", "enable_thinking": False}, {"enable_thinking": False}),
    ({"CHAT_TEMPLATE": "x", "template_path": "/t.jinja", "jinja": "x", "thinking": True}, {"thinking": True}),
    ({"chat_template": "tool_use"}, None),  # a template's name counts too; nothing left: none sent
    ({"enable_thinking": True, "reasoning_effort": "low"}, {"enable_thinking": True, "reasoning_effort": "low"}),
    (None, None),
])
def test_a_tier_sends_no_chat_template_from_a_request_unless_it_trusts_them(kwargs, kept) -> None:
    tier = TierConfig(name="t", backends=[])
    trusting = msgspec.structs.replace(tier, trust_request_chat_template=True)
    req = msgspec.convert({"model": "t", "messages": [{"role": "user", "content": "Q"}],
                           "chat_template_kwargs": kwargs}, ChatCompletionRequest)
    assert upstream.engine_template_kwargs(tier, kwargs) == kept
    assert upstream.engine_request(req, tier, "m").chat_template_kwargs == kept  # the picker's body
    sent = upstream.template(tier, req.messages, upstream.sampling_of(req, 0)).extra  # the gateway's
    assert sent.get("chat_template_kwargs") == kept and ("chat_template_kwargs" in sent) == (kept is not None)
    assert upstream.engine_request(req, trusting, "m").chat_template_kwargs == kwargs
    assert upstream.template(trusting, req.messages, upstream.sampling_of(req, 0)).extra.get(
        "chat_template_kwargs") == kwargs
