"""`reasoning_effort` as a quality hint: how a request's effort is read, what it routes as, and which hint wins.

    effort = read_effort(req.reasoning_effort, req.reasoning)      # None, or an Effort (InvalidRequest naming it)
    asked = effort_hint(effort, table)                              # the hint, branches and thinking it asks for
    hint, source = pick_hint(body, header, alias, asked, default)   # the one precedence rule

Values: a level of cascade.schemas.EFFORT_LEVELS (OpenAI's `none` to `xhigh`, SGLang's and vLLM's `max`, SGLang's
`ultra`; any case, surrounding spaces ignored), or a number in [0, 0.99] as SGLang takes one (a JSON number, or a
numeric string as SGLang's lax decoding reads one), whose level is the range it falls in (EFFORT_NUMBER_LEVELS). It
is read from `reasoning_effort` or from the nested `reasoning: {"effort": ...}` form (the Responses API's); both at
once must agree.

Precedence (`pick_hint`, the one place it is decided; docs/configuration.md, "Quality hints"): an explicit cascade
hint (the body's `quality`, then the X-Cascade-Quality header, then a `cascade:<hint>` model alias) beats
`reasoning_effort`, which beats the gateway's `default_quality`. A request that names a tier keeps that tier, and its
effort only sets the engine's thinking (on or off, and its budget: cascade/tiers/thinking.py).

Pure functions over plain values, so that any adapter (chat completions, the Responses API) reads effort the same way.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from cascade.config import EffortConfig
from cascade.errors import ConfigError, InvalidRequest
from cascade.router.policy import QualityHint, parse_hint
from cascade.schemas import EFFORT_LEVELS, EFFORT_NUMBER_LEVELS, EFFORT_NUMBER_MAX, Effort, ReasoningRequest

NESTED_PARAM = "reasoning.effort"
TOP_PARAM = "reasoning_effort"
SHOWN_CHARS = 40  # of a client's bad value, in the error message
# Where the hint a request is routed with came from (`pick_hint`).
HintSource = Literal["quality", "header", "alias", "effort", "default"]


def read_effort(top: str | float | None, nested: ReasoningRequest | None) -> Effort | None:
    """The request's effort from `reasoning_effort` (`top`) or `reasoning.effort` (`nested`), or None when it sets
    none; InvalidRequest naming the field whose value is not an effort, or both when they differ."""
    inner = None if nested is None else nested.effort
    first = None if top is None else parse_effort(top, TOP_PARAM)
    second = None if inner is None else parse_effort(inner, NESTED_PARAM)
    if first is not None and second is not None and first.value != second.value:
        raise InvalidRequest(f"`{TOP_PARAM}` ({_shown(top)}) and `{NESTED_PARAM}` ({_shown(inner)}) differ: give "
                             "one of them", NESTED_PARAM)
    return first if first is not None else second


def parse_effort(raw: str | float, param: str = TOP_PARAM) -> Effort:
    """One effort value (InvalidRequest naming `param` when it is none)."""
    if isinstance(raw, bool):  # JSON true is no effort (msgspec never gives one; a caller's dict might)
        raise InvalidRequest(_expected(param, raw), param)
    if isinstance(raw, str):
        name = raw.strip().lower()
        if name in EFFORT_LEVELS:
            return Effort(level=name, value=name, param=param)
        try:
            number = float(name) if len(name) <= SHOWN_CHARS else math.nan
        except ValueError:
            raise InvalidRequest(_expected(param, raw), param) from None
    else:
        number = float(raw)
    if not 0.0 <= number <= EFFORT_NUMBER_MAX:  # NaN and infinities fail too
        raise InvalidRequest(_expected(param, raw), param)
    level = next(name for bound, name in EFFORT_NUMBER_LEVELS if number < bound)
    return Effort(level=level, value=number, param=param)


class EffortHint(msgspec.Struct, frozen=True, kw_only=True):
    """What an effort asks of cascade: the hint to route with, the branches to run (0: the tier's own), and the
    effort with its thinking switch as the table sets it."""

    hint: QualityHint
    branches: int
    effort: Effort


class EffortTable:
    """`[routing.effort]` with its hints parsed once (ConfigError naming the key of one that is not a hint)."""

    def __init__(self, config: EffortConfig) -> None:
        self.config = config
        self.hints: dict[str, QualityHint] = {}
        for level in EFFORT_LEVELS:
            key = f"routing.effort.{level}.quality"
            try:
                hint = parse_hint(config.route(level).quality, key)
            except InvalidRequest as exc:
                raise ConfigError(exc.message) from None
            if hint is None:
                raise ConfigError(f"`{key}` is empty: name a quality hint (fast, balanced, best) or a number in (0, 1]")
            self.hints[level] = hint


def effort_hint(effort: Effort, table: EffortTable) -> EffortHint:
    """The mapping: what `effort` routes as under `table`."""
    route = table.config.route(effort.level)
    thinking = effort if effort.thinking == route.thinking else msgspec.structs.replace(effort, thinking=route.thinking)
    return EffortHint(hint=table.hints[effort.level], branches=route.branches, effort=thinking)


def pick_hint(body: QualityHint | None, header: QualityHint | None, alias: QualityHint | None,
              effort: EffortHint | None, default: QualityHint) -> tuple[QualityHint, HintSource]:
    """The hint a routed request is served with, and where it came from: the body's `quality`, the X-Cascade-Quality
    header, the `cascade:<hint>` model alias, `reasoning_effort`, the gateway's default, first set wins."""
    if body is not None:
        return body, "quality"
    if header is not None:
        return header, "header"
    if alias is not None:
        return alias, "alias"
    if effort is not None:
        return effort.hint, "effort"
    return default, "default"


class EffortUse(msgspec.Struct, frozen=True, kw_only=True):
    """What a request's effort does once its hint is chosen: the effort as its engines are told it, the branches it
    sets (0: none: another hint or the named tier decided), and what `cascade.note` says of it."""

    effort: Effort
    branches: int
    note: str


def effort_use(asked: EffortHint, source: HintSource | None, hint: QualityHint | None) -> EffortUse:
    """What `asked` does when the request is routed with `hint` from `source` (both None: the request named a tier,
    so the effort sets only the engine's thinking)."""
    said = f"`{asked.effort.param}` {_shown(asked.effort.value)}"
    switch = "on" if asked.effort.thinking else "off"
    if source is None or hint is None:
        note = f"{said}: a tier was named, so it sets only the engine's thinking ({switch})"
    elif source == "effort":
        one = ", one branch" if asked.branches == 1 else f", {asked.branches} branches" if asked.branches else ""
        note = f"{said}: routed as quality `{hint.label}`{one}, thinking {switch}"
    else:
        where = {"quality": "the body's `quality`", "header": "the X-Cascade-Quality header",
                 "alias": "the model alias", "default": "the default"}[source]
        note = f"{said}: routed as quality `{hint.label}` from {where}, which comes first; thinking {switch}"
    return EffortUse(effort=asked.effort, branches=asked.branches if source == "effort" else 0, note=note)


def _expected(param: str, raw: object) -> str:
    return (f"`{param}` must be one of {', '.join(EFFORT_LEVELS)} or a number in [0, {EFFORT_NUMBER_MAX}], got "
            f"{_shown(raw)}")


def _shown(raw: object) -> str:
    """A client's value quoted in a message, cut to SHOWN_CHARS characters."""
    text = raw if isinstance(raw, str) else f"{raw:g}" if isinstance(raw, float) else str(raw)
    return repr(text[:SHOWN_CHARS]) + ("..." if len(text) > SHOWN_CHARS else "")
