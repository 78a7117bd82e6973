"""What a tier's engines are told of a request's reasoning effort (cascade/tiers/thinking.py), in both bodies cascade
sends (the gateway's upstream template, the Envoy picker's engine body), and the checks of `[tiers.thinking]`."""

from __future__ import annotations

import json

import msgspec
import pytest

from cascade.config import TierConfig, decode_config
from cascade.errors import ConfigError
from cascade.router.effort import parse_effort
from cascade.schemas import ChatCompletionRequest, ChatMessage, Effort
from cascade.tiers import upstream
from cascade.tiers.thinking import effort_fields, history_messages

SGLANG = {"kind": "sglang", "url": "http://127.0.0.1:9"}
OPENAI = {"kind": "openai", "url": "http://127.0.0.1:9", "model": "m"}
WORKER = {"kind": "worker", "worker": "w", "unsupported_params": ["reasoning_effort"]}
BUDGETS = {"low": 512, "high": 8192}


def tier(*backends: dict[str, object], **thinking: object) -> TierConfig:
    return msgspec.convert({"name": "t", "backends": list(backends), "thinking": thinking}, TierConfig)


def effort(value: str | float, thinking: bool = True) -> Effort:
    return msgspec.structs.replace(parse_effort(value), thinking=thinking)


def test_sglang_gets_the_effort_as_sent_the_switch_and_its_budget_field() -> None:
    fields = effort_fields(tier(SGLANG, budget_tokens=BUDGETS), effort(0.8), None)
    assert fields == {"reasoning_effort": 0.8, "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
                      "custom_params": {"thinking_budget": 8192}}


def test_an_openai_compatible_engine_gets_the_level_and_vllms_budget_field() -> None:
    fields = effort_fields(tier(OPENAI, budget_tokens=BUDGETS), effort(0.3), None)
    assert fields == {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
                      "thinking_token_budget": 512}


def test_an_engine_that_does_not_take_the_field_gets_only_the_switch() -> None:
    assert effort_fields(tier(WORKER), effort("medium"), None) == {
        "chat_template_kwargs": {"enable_thinking": True, "thinking": True}}
    assert effort_fields(tier(WORKER, switch=[]), effort("medium"), None) == {}


def test_thinking_off_is_sent_explicitly_with_no_budget_and_the_clients_own_keys_come_first() -> None:
    fields = effort_fields(tier(SGLANG, budget_tokens={"none": 5}), effort("none", thinking=False),
                           {"thinking": True, "custom": 1})
    assert fields == {"reasoning_effort": "none",
                      "chat_template_kwargs": {"thinking": True, "custom": 1, "enable_thinking": False}}


def test_a_level_without_a_budget_sends_none() -> None:
    assert "custom_params" not in effort_fields(tier(SGLANG, budget_tokens=BUDGETS), effort("medium"), None)


def test_the_history_goes_under_the_name_the_engines_read() -> None:
    turns = [ChatMessage(role="user", content="q"), ChatMessage(role="assistant", content="a", reasoning_content="r")]
    assert history_messages(tier(SGLANG), turns) is turns
    vllm = history_messages(tier(OPENAI, history_field="reasoning"), turns)
    assert [(m.reasoning_content, m.reasoning) for m in vllm] == [(None, None), (None, "r")]


def test_the_upstream_template_carries_the_effort_and_cascades_own_fields_stay_home() -> None:
    req = msgspec.convert({"model": "t", "messages": [{"role": "user", "content": "q"}], "reasoning_effort": "high",
                           "chat_template_kwargs": {"chat_template": "{{ x }}", "enable_thinking": False}},
                          ChatCompletionRequest)
    sent = upstream.template(tier(SGLANG, budget_tokens=BUDGETS), req.messages,
                             upstream.sampling_of(req, 0, effort("high")))
    # The template key is dropped (the tier does not trust it); the client's switch stays as the client set it.
    assert sent.extra == {"reasoning_effort": "high", "custom_params": {"thinking_budget": 8192},
                          "chat_template_kwargs": {"enable_thinking": False, "thinking": True}}
    assert upstream.template(tier(SGLANG), req.messages, upstream.sampling_of(req, 0)).extra == {
        "chat_template_kwargs": {"enable_thinking": False}}  # no effort read: nothing added


def test_the_pickers_engine_body_carries_the_effort_at_the_top_and_the_budget() -> None:
    req = msgspec.convert({"model": "cascade", "messages": [{"role": "assistant", "content": "a", "reasoning": "r"},
                                                            {"role": "user", "content": "q"}],
                           "reasoning": {"effort": "low"}}, ChatCompletionRequest)
    told = effort("low")
    body = json.loads(upstream.engine_body(req, tier(OPENAI, budget_tokens=BUDGETS, history_field="reasoning"), "m",
                                           told))
    assert (body["reasoning_effort"], body["thinking_token_budget"], "reasoning" in body) == ("low", 512, False)
    assert body["messages"][0]["reasoning"] == "r" and "reasoning_content" not in body["messages"][0]
    assert json.loads(upstream.engine_body(req, tier(WORKER), "m", None)).get("reasoning_effort") is None


@pytest.mark.parametrize(("thinking", "backends", "message"), [
    ({"budget_tokens": {"high": 10}}, [WORKER], "the embedded engine has no thinking budget"),
    ({"budget_tokens": {"high": 10}}, [SGLANG, OPENAI], "every backend of the tier on SGLang"),
    ({"budget_tokens": {"hard": 10}}, [SGLANG], "not effort levels"),
    ({"budget_tokens": {"high": 0}}, [SGLANG], r"thinking\.budget_tokens"),
    ({"history_field": "reasoning"}, [SGLANG], "not SGLang's"),
    ({"switch": [f"k{i}" for i in range(9)]}, [SGLANG], "at most 8"),
    ({"switch": [""]}, [SGLANG], "1 to 64 characters"),
])
def test_a_thinking_table_that_cannot_work_fails_at_start_naming_its_key(thinking: dict[str, object],
                                                                          backends: list[dict[str, object]],
                                                                          message: str) -> None:
    rows = ", ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in b.items()) + " }" for b in backends)
    table = "\n".join(f"{k} = {json.dumps(v) if not isinstance(v, dict) else _inline(v)}" for k, v in thinking.items())
    toml = (f'[[workers]]\nname = "w"\nmodel = "smollm2-135m"\n[[tiers]]\nname = "t"\nbackends = [{rows}]\n'
            f"[tiers.thinking]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        decode_config(toml)


def _inline(table: dict[str, object]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"


def test_the_default_thinking_table_suits_every_kind() -> None:
    toml = (f'[[workers]]\nname = "w"\nmodel = "smollm2-135m"\n[[tiers]]\nname = "t"\n'
            f'backends = [{{ kind = "worker", worker = "w" }}, {{ kind = "openai", url = "{OPENAI["url"]}", '
            f'model = "m" }}, {{ kind = "sglang", url = "{SGLANG["url"]}" }}]\n')
    assert decode_config(toml).tiers[0].thinking.switch == ("enable_thinking", "thinking")
