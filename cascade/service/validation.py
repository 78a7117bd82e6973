"""What a chat request may ask for: the limits its types cannot express, the bounds on what it sends on to an engine,
and its branch overrides per tier.

Everything here is checked before a tier is asked, so that a bad request is a 400 with the parameter named,
never an error event inside a 200 stream. The bounds on forwarded fields (`engine_bounds`; docs/operations.md, "What
reaches an engine") are OpenAI's where it states one and never looser than SGLang's own checks
(sampling/sampling_params.py `verify`; tests/contract/ holds them side by side); counts are checked before entries,
so a hostile request costs at most one pass over what it sent.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from cascade.config import BranchSettings, BrokenRule, Limits, TierConfig, check_branches
from cascade.errors import InvalidRequest
from cascade.schemas import (
    LOGIT_BIAS,
    MAX_TOKEN_ID,
    MAX_TOP_K,
    ONE_ANSWER,
    PASSTHROUGH,
    PENALTY,
    SERVICE_TIER_CHARS,
    TOKEN_ID_DIGITS,
    BranchOverride,
    ChatCompletionRequest,
)
from cascade.tiers.build import Tier
from cascade.tiers.thinking import takes_effort
from cascade.tiers.upstream import stops, template_keys


def validate(req: ChatCompletionRequest, lim: Limits) -> int:
    """Check limits the types cannot express; return the max_tokens to use (0: the tier's default)."""
    if not req.messages:
        raise InvalidRequest("`messages` must contain at least one message", "messages", "empty_messages")
    if len(req.messages) > lim.max_messages:
        raise InvalidRequest(f"`messages` has {len(req.messages)} entries; the limit is {lim.max_messages}",
                             "messages")
    if not 1 <= req.n <= lim.max_n:
        raise InvalidRequest(f"`n` must be between 1 and {lim.max_n}, got {req.n}", "n")
    if req.temperature is not None and not (0.0 <= req.temperature <= 2.0 and math.isfinite(req.temperature)):
        raise InvalidRequest(f"`temperature` must be in [0, 2], got {req.temperature}", "temperature")
    if req.top_p is not None and not (0.0 < req.top_p <= 1.0):
        raise InvalidRequest(f"`top_p` must be in (0, 1], got {req.top_p}", "top_p")
    if len(stops(req)) > lim.max_stop_sequences:
        raise InvalidRequest(f"`stop` may have at most {lim.max_stop_sequences} sequences", "stop")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("`stream_options` is only allowed when `stream` is true", "stream_options")
    for name in ("max_completion_tokens", "max_tokens"):
        value = getattr(req, name)
        if value is not None and not 1 <= value <= lim.max_tokens:
            raise InvalidRequest(f"`{name}` must be between 1 and {lim.max_tokens}, got {value}", name)
    engine_bounds(req, lim)
    return req.token_limit or 0


def limit_note(req: ChatCompletionRequest) -> str | None:
    """What `cascade.note` says when the request sets both limits and they differ (None: it does not)."""
    if req.max_tokens is None or req.max_completion_tokens is None or req.max_tokens == req.max_completion_tokens:
        return None
    return (f"`max_completion_tokens` ({req.max_completion_tokens}) is the limit: `max_tokens` ({req.max_tokens}), "
            "deprecated by OpenAI, is not read when both are set")


def engine_bounds(req: ChatCompletionRequest, lim: Limits) -> None:
    """The forwarded fields (PASSTHROUGH) within their bounds, else InvalidRequest naming the first one past."""
    for name in ("presence_penalty", "frequency_penalty"):
        _within(getattr(req, name), -PENALTY, PENALTY, name)
    _within(req.min_p, 0.0, 1.0, "min_p")
    if req.repetition_penalty is not None and not (0.0 < req.repetition_penalty <= 2.0):
        raise InvalidRequest(f"`repetition_penalty` must be in (0, 2], got {req.repetition_penalty}",
                             "repetition_penalty")
    if req.top_k is not None and not (req.top_k == -1 or 1 <= req.top_k <= MAX_TOP_K):
        raise InvalidRequest(f"`top_k` must be -1 (no limit) or from 1 to {MAX_TOP_K}, got {req.top_k}", "top_k")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= lim.max_top_logprobs:
        raise InvalidRequest(f"`top_logprobs` must be between 0 and {lim.max_top_logprobs}, got {req.top_logprobs}",
                             "top_logprobs")
    if req.logit_bias is not None:
        _logit_bias(req.logit_bias, lim.max_logit_bias)
    if req.tools is not None:
        _tools(req.tools, lim)
    if req.metadata is not None:
        check_metadata(req.metadata, lim)
    if req.user is not None and len(req.user) > lim.max_user_chars:
        raise InvalidRequest(f"`user` has {len(req.user)} characters; the limit is {lim.max_user_chars}", "user")
    if req.chat_template_kwargs is not None and len(req.chat_template_kwargs) > lim.max_template_kwargs:
        raise InvalidRequest(f"`chat_template_kwargs` has {len(req.chat_template_kwargs)} keys; the limit is "
                             f"{lim.max_template_kwargs}", "chat_template_kwargs")
    if req.stop_token_ids is not None:
        _token_ids(req.stop_token_ids, lim.max_stop_token_ids)
    # SGLang refuses a minimum past the limit (sampling_params.py `verify`); the tier's default limit: `check_tier`.
    most = req.token_limit or lim.max_tokens
    if req.min_tokens is not None and not 0 <= req.min_tokens <= most:
        raise InvalidRequest(f"`min_tokens` must be between 0 and the token limit ({most}), got {req.min_tokens}",
                             "min_tokens")
    if req.service_tier is not None and len(req.service_tier) > SERVICE_TIER_CHARS:
        raise InvalidRequest(f"`service_tier` may have at most {SERVICE_TIER_CHARS} characters", "service_tier")


def _within(value: float | None, low: float, high: float, name: str) -> None:
    if value is not None and not low <= value <= high:  # NaN is in no range
        raise InvalidRequest(f"`{name}` must be in [{low:g}, {high:g}], got {value}", name)


def _logit_bias(bias: dict[str, float], limit: int) -> None:
    if len(bias) > limit:
        raise InvalidRequest(f"`logit_bias` has {len(bias)} entries; the limit is {limit}", "logit_bias")
    for token, value in bias.items():
        if not (0 < len(token) <= TOKEN_ID_DIGITS and token.isascii() and token.isdigit()):
            raise InvalidRequest(f"`logit_bias` keys must be token ids ({TOKEN_ID_DIGITS} digits at most), got "
                                 f"{token[:20]!r}", "logit_bias")
        if not -LOGIT_BIAS <= value <= LOGIT_BIAS:
            raise InvalidRequest(f"`logit_bias` values must be in [-100, 100], got {value} for token {token}",
                                 "logit_bias")


def _token_ids(ids: list[int], limit: int) -> None:
    if len(ids) > limit:
        raise InvalidRequest(f"`stop_token_ids` has {len(ids)} entries; the limit is {limit}", "stop_token_ids")
    wrong = next((i for i in ids if not 0 <= i <= MAX_TOKEN_ID), None)
    if wrong is not None:
        raise InvalidRequest(f"`stop_token_ids` entries must be token ids from 0 to {MAX_TOKEN_ID}, got "
                             f"{str(wrong)[:24]}", "stop_token_ids")


def _tools(tools: list[dict[str, Any]], lim: Limits) -> None:
    if len(tools) > lim.max_tools:
        raise InvalidRequest(f"`tools` has {len(tools)} entries; the limit is {lim.max_tools}", "tools")
    size = len(msgspec.json.encode(tools))  # bounded by the body limit: one pass over what was sent
    if size > lim.max_tools_bytes:
        raise InvalidRequest(f"`tools` is {size} bytes as JSON; the limit is {lim.max_tools_bytes}", "tools")


def check_metadata(metadata: dict[str, str], lim: Limits) -> None:
    if len(metadata) > lim.max_metadata_pairs:
        raise InvalidRequest(f"`metadata` has {len(metadata)} pairs; the limit is {lim.max_metadata_pairs}",
                             "metadata")
    for key, value in metadata.items():
        if len(key) > lim.max_metadata_key_chars:
            raise InvalidRequest(f"`metadata` keys may have at most {lim.max_metadata_key_chars} characters",
                                 "metadata")
        if len(value) > lim.max_metadata_value_chars:
            raise InvalidRequest(f"`metadata` values may have at most {lim.max_metadata_value_chars} characters "
                                 f"(key {key!r})", "metadata")


def check_tier(req: ChatCompletionRequest, tier: Tier, lim: Limits, used: set[str] | None = None
               ) -> BranchSettings | None:
    """What `tier` cannot do for this request (a forwarded field its engine would ignore, bad branch settings),
    raised as InvalidRequest; else the request's branch settings on that tier (None: one branch). `used`:
    `forwarded(req)`, when the caller checks several tiers."""
    if refused := sorted((forwarded(req) if used is None else used) & tier.unsupported):
        raise InvalidRequest(f"tier `{tier.name}`'s engine does not support `{refused[0]}` (it would ignore "
                             "it): name a tier whose engine does, or leave the field out", refused[0])
    check_min_tokens(req, tier.config)
    return branches_for(req, tier, lim)


def check_min_tokens(req: ChatCompletionRequest, tier: TierConfig) -> None:
    """`min_tokens` within `tier`'s default limit when the request sets none (`engine_bounds` checked it against the
    request's own): SGLang refuses a minimum past the limit it generates to."""
    if req.min_tokens and req.token_limit is None and req.min_tokens > tier.default_max_tokens:
        raise InvalidRequest(f"`min_tokens` ({req.min_tokens}) is past tier `{tier.name}`'s default limit of "
                             f"{tier.default_max_tokens} tokens: set `max_completion_tokens` too", "min_tokens")


def branches_for(req: ChatCompletionRequest, tier: Tier, lim: Limits) -> BranchSettings | None:
    """The tier's SART settings with the request's overrides (validated), or None for one branch."""
    override = req.branches
    one_answer = one_answer_field(req)
    if one_answer is not None:
        if override is not None and (override.n or 1) > 1:
            raise InvalidRequest(f"`branches.n` > 1 cannot be combined with `{one_answer}`: branches vote on "
                                 "answer text, and that field asks for the engine's one answer as it is",
                                 "branches.n")
        return None  # one branch, the engine's answer as it gave it (cascade.note says so)
    settings = tier.config.branches
    if override is not None:
        settings = _overridden(settings, override, lim.max_branches)
    if settings.n > 1 and tier.greedy_only:
        raise InvalidRequest(f"tier `{tier.name}`'s engine decodes every request greedily (an embedded worker at "
                             f"temperature 0), so its {settings.n} branches would be one answer repeated: ask a "
                             "tier that runs branches", "branches.n")
    streams, limit = settings.n * req.n, lim.max_streams_per_request
    if streams > limit:
        raise InvalidRequest(f"{settings.n} branches x n={req.n} would open {streams} backend streams on tier "
                             f"`{tier.name}`; the limit per request is {limit}",
                             "branches.n" if override is not None else "n")
    if tier.slots is not None and streams > tier.slots.capacity:
        raise InvalidRequest(f"{settings.n} branches x n={req.n} exceed tier `{tier.name}`'s "
                             f"{tier.slots.capacity} branch slots", "branches.n")
    return settings if settings.n > 1 else None


def _overridden(settings: BranchSettings, override: BranchOverride, max_branches: int) -> BranchSettings:
    """The tier's `settings` with the request's `override`, checked by the settings' own rules (check_branches)
    and the limits a client is held to beyond them."""
    n = override.n if override.n is not None else settings.n
    settings = msgspec.structs.replace(
        settings, n=n, m=override.m if override.m is not None else min(settings.m, n),
        alpha=settings.alpha if override.alpha is None else override.alpha,
        beta=settings.beta if override.beta is None else override.beta,
        k=settings.k if override.k is None else override.k,
        aggregation=override.aggregation or settings.aggregation,
    )
    if not 1 <= settings.n <= max_branches:
        raise InvalidRequest(f"`branches.n` must be between 1 and {max_branches}", "branches.n")
    if settings.first_wave >= settings.m:  # the request's M leaves no room for the tier's first wave, nor for the
        # stopping level learned from it
        settings = msgspec.structs.replace(settings, first_wave=0, wave_margin=0, confidence_keep=0.0)
    try:
        check_branches(settings, lambda key: f"branches.{key}")
    except BrokenRule as broken:
        raise InvalidRequest(f"`branches.{broken.key}` {broken.rule}", f"branches.{broken.key}") from None
    if settings.beta > settings.n:
        raise InvalidRequest(f"`branches.beta` must be between 0 and branches.n ({settings.n})", "branches.beta")
    if settings.k > 1000:
        raise InvalidRequest("`branches.k` must be between 1 and 1000", "branches.k")
    return settings


def forwarded(req: ChatCompletionRequest) -> set[str]:
    """The PASSTHROUGH fields the request sets to something an engine could act on (`logprobs: false` and
    `stop_token_ids: []` ask for nothing)."""
    return {name for name in PASSTHROUGH if _asks(getattr(req, name))}


def _asks(value: object) -> bool:
    return value not in (None, False) and not (isinstance(value, (list, dict, str)) and len(value) == 0)


def template_note(req: ChatCompletionRequest, tiers: list[Tier]) -> str | None:
    """What `cascade.note` says when the request's `chat_template_kwargs` name a template that some of the `tiers` it
    may reach drop (cascade/tiers/upstream.py `engine_template_kwargs`); None: nothing dropped."""
    dropped = template_keys(req.chat_template_kwargs)
    untrusting = [t.name for t in tiers if not t.config.trust_request_chat_template]
    if not dropped or not untrusting:
        return None
    keys = ", ".join(f"`chat_template_kwargs.{key[:64]}`" for key in dropped[:3])  # a client's keys, cut
    return (f"{keys} not sent: tier(s) {', '.join(f'`{n}`' for n in untrusting)} take no chat template from a "
            "request (trust_request_chat_template)")


def effort_unsent_note(tiers: list[Tier]) -> str | None:
    """What `cascade.note` says when some of the `tiers` a request with a reasoning effort may reach do not take
    `reasoning_effort` as a field (a backend lists it in `unsupported_params`: the embedded engine); None: all do.
    It still routes the request and sets the thinking switch there (cascade/tiers/thinking.py)."""
    left = [t.name for t in tiers if not takes_effort(t.config)]
    if not left:
        return None
    names = ", ".join(f"`{n}`" for n in left)
    return f"`reasoning_effort` not sent as a field to {names}: their engines do not take it"


def one_answer_field(req: ChatCompletionRequest) -> str | None:
    """The first field the request sets that asks for the engine's one answer (tools, logprobs, a format)."""
    return next((name for name in ONE_ANSWER if getattr(req, name) not in (None, False)), None)
