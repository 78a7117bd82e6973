"""`[routing.effort]` of `cascade.toml`: what each `reasoning_effort` level a client sends asks of cascade (the
quality hint it routes as, the reasoning branches it runs, whether the engine thinks), and `[tiers.thinking]`: how a
tier's engine is told to think or not, and for how long.

The mapping itself is cascade/router/effort.py (`effort_hint`); what reaches an engine, cascade/tiers/thinking.py.
Defaults: `none` and `minimal` answer directly on the cheapest tier (`fast`, one branch; `none` also turns the
engine's thinking off), `low` is `fast`, `medium` `balanced`, and `high` and above `best` with the tier's own branches.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from cascade.config.base import PositiveInt, Strict
from cascade.errors import ConfigError
from cascade.schemas import EFFORT_LEVELS


class EffortRoute(Strict, frozen=True):
    """What one effort level asks for."""

    # A quality hint: `fast`, `balanced`, `best`, or an accuracy target in (0, 1] (checked when the gateway starts,
    # as `gateway.default_quality` is).
    quality: str | float
    # Reasoning branches per request on the tier that serves it (0: the tier's own `[tiers.branches]`; 1: one direct
    # answer). A request's own `branches` comes first.
    branches: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 0
    # Ask the engine to think (the tier's `[tiers.thinking] switch` keys true) or not (false).
    thinking: bool = True


class EffortConfig(Strict, frozen=True):
    """One route per level of cascade.schemas.EFFORT_LEVELS; a number is read as the level its range falls in."""

    none: EffortRoute = EffortRoute(quality="fast", branches=1, thinking=False)
    minimal: EffortRoute = EffortRoute(quality="fast", branches=1)
    low: EffortRoute = EffortRoute(quality="fast")
    medium: EffortRoute = EffortRoute(quality="balanced")
    high: EffortRoute = EffortRoute(quality="best")
    xhigh: EffortRoute = EffortRoute(quality="best")
    max: EffortRoute = EffortRoute(quality="best")
    ultra: EffortRoute = EffortRoute(quality="best")

    def route(self, level: str) -> EffortRoute:
        """The route of `level` (one of EFFORT_LEVELS)."""
        route = getattr(self, level)
        assert isinstance(route, EffortRoute)
        return route


assert tuple(EffortConfig.__struct_fields__) == EFFORT_LEVELS  # one route per level, in the wire's order

# What a tier's engine reads in an earlier assistant turn: SGLang, llama.cpp and vLLM before 2026 `reasoning_content`,
# vLLM since 2026 `reasoning`.
HistoryField = Literal["reasoning_content", "reasoning"]


class ThinkingConfig(Strict, frozen=True):
    """How a request's `reasoning_effort` reaches this tier's engines (cascade/tiers/thinking.py)."""

    # `chat_template_kwargs` keys set true when the effort asks the engine to think, false when not (`none`), unless
    # the request sets them itself: `enable_thinking` (Qwen3, GLM-4.5) and `thinking` (DeepSeek-V3, Kimi K2), as
    # SGLang sets both; a template ignores a variable it does not read. Empty: no switch is sent.
    switch: tuple[str, ...] = ("enable_thinking", "thinking")
    # Reasoning tokens at most per effort level while the engine thinks (a level not named: no budget). Sent as SGLang's
    # `custom_params.thinking_budget` (it needs --enable-strict-thinking, or its thinking-budget logit processor) to
    # a tier on SGLang, and as vLLM's `thinking_token_budget` (it needs --reasoning-config) to one on `kind = "openai"`
    # engines; the embedded engine has no budget, and a tier with replicas of both kinds cannot be given one.
    budget_tokens: dict[str, PositiveInt] = msgspec.field(default_factory=dict)
    history_field: HistoryField = "reasoning_content"


MAX_SWITCH_KEYS = 8  # `switch` keys at most: every one goes into every request's chat_template_kwargs


def check_thinking(thinking: ThinkingConfig, where: str, kinds: set[str]) -> None:
    """What the types cannot say about a tier's `[tiers.thinking]` (`where`: its key path), given its backends'
    `kinds`."""
    if len(thinking.switch) > MAX_SWITCH_KEYS or not all(0 < len(k) <= 64 for k in thinking.switch):
        raise ConfigError(f"`{where}.switch` takes at most {MAX_SWITCH_KEYS} chat_template_kwargs keys of 1 to 64 "
                          f"characters, got {list(thinking.switch)[:MAX_SWITCH_KEYS + 1]}")
    if unknown := sorted(set(thinking.budget_tokens) - set(EFFORT_LEVELS)):
        raise ConfigError(f"`{where}.budget_tokens` names {unknown}, which are not effort levels "
                          f"({', '.join(EFFORT_LEVELS)})")
    if thinking.budget_tokens and (kinds - {"sglang"} and kinds - {"openai"}):
        raise ConfigError(f"`{where}.budget_tokens` needs every backend of the tier on SGLang or every one on "
                          f"`kind = \"openai\"` (vLLM): the embedded engine has no thinking budget, and each kind "
                          f"takes it under its own name; this tier's are {', '.join(sorted(kinds))}")
    if thinking.history_field == "reasoning" and "sglang" in kinds:
        raise ConfigError(f"`{where}.history_field` \"reasoning\" is not SGLang's: it reads an assistant turn's "
                          "`reasoning_content`")


def check_effort(effort: EffortConfig) -> None:
    """A numeric `quality` is an accuracy target (a named one is parsed when the gateway starts, as
    `gateway.default_quality` is, and so is a target the routing signal cannot meet)."""
    for level in EFFORT_LEVELS:
        quality = effort.route(level).quality
        if isinstance(quality, float | int) and not 0.0 < quality <= 1.0:  # NaN fails too
            raise ConfigError(f"`routing.effort.{level}.quality` as a number is an accuracy target in (0, 1], "
                              f"got {quality}")

