"""What a tier's engines are told of a request's reasoning (its tier's `[tiers.thinking]`, cascade/config/effort.py):
written once, for both bodies cascade sends an engine (cascade/tiers/upstream.py `template` and `engine_request`).

* `effort_fields`: for a request with a reasoning effort, the fields an engine reads:
  - `reasoning_effort`, where every backend of the tier takes it (none lists it in `unsupported_params`): as sent to
    SGLang (a level, or its number), as its level to other engines (vLLM takes levels only);
  - the thinking switch: each `switch` key of `chat_template_kwargs` (`enable_thinking`, `thinking`) set explicitly
    true or false, as `[routing.effort]` says for the level, unless the request set that key itself (SGLang's own
    rule for `reasoning_effort`, `setdefault`);
  - the level's thinking budget while the engine thinks, where the tier sets one: SGLang's
    `custom_params.thinking_budget`, vLLM's `thinking_token_budget`.
* `history_messages`: an earlier assistant turn's reasoning under the name the tier's engines read (`history_field`):
  cascade keeps it as `reasoning_content` (cascade/service/bodies.py reads either name).

tests/contract/ checks that every field sent to SGLang is one its protocol models declare.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cascade.config import TierConfig
from cascade.schemas import ChatMessage, Effort

SGLANG_BUDGET = "custom_params"  # {"thinking_budget": N} (srt/constrained/grammar_manager.py, strict thinking)
SGLANG_BUDGET_KEY = "thinking_budget"
VLLM_BUDGET = "thinking_token_budget"


def takes_effort(tier: TierConfig) -> bool:
    """Whether every backend of `tier` takes `reasoning_effort` (none lists it in `unsupported_params`)."""
    return all("reasoning_effort" not in b.unsupported_params for b in tier.backends)


def effort_fields(tier: TierConfig, effort: Effort, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The fields `tier`'s engines get for `effort`, given the request's `chat_template_kwargs` as they are sent
    (`kwargs`, after the tier dropped template keys): `reasoning_effort`, `chat_template_kwargs` with the switch,
    the budget; each only where it applies."""
    kinds = tier.kinds
    fields: dict[str, Any] = {}
    if takes_effort(tier):
        fields["reasoning_effort"] = effort.value if kinds == {"sglang"} else effort.level
    switched = dict(kwargs or {})
    for key in tier.thinking.switch:
        switched.setdefault(key, effort.thinking)
    if switched:
        fields["chat_template_kwargs"] = switched
    budget = tier.thinking.budget_tokens.get(effort.level) if effort.thinking else None
    if budget is not None:  # config: every backend on SGLang, or every one an OpenAI-compatible server
        if kinds == {"sglang"}:
            fields[SGLANG_BUDGET] = {SGLANG_BUDGET_KEY: budget}
        else:
            fields[VLLM_BUDGET] = budget
    return fields


def history_messages(tier: TierConfig, messages: list[ChatMessage]) -> list[ChatMessage]:
    """`messages` with each turn's reasoning under the name `tier`'s engines read."""
    if tier.thinking.history_field == "reasoning_content":
        return messages
    return [msgspec.structs.replace(m, reasoning=m.reasoning_content, reasoning_content=None)
            if m.reasoning_content is not None else m for m in messages]
