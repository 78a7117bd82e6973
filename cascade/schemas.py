"""OpenAI chat-completions wire types as msgspec Structs, shared by the gateway, backends and loadgen.

Requests are decoded strictly (unknown fields are an error naming the field, as OpenAI does);
responses from engines are decoded leniently (engines add fields such as `reasoning_content`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgspec


class TextPart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(msgspec.Struct, kw_only=True):
    """A tool call in an assistant message (an agent's earlier turn, or an answer)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A piece of a streamed tool call: pieces with the same `index` concatenate."""

    index: int = -1  # always sent in streams; -1 only while decoding a message's whole calls
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class ChatMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    # An assistant turn's reasoning: SGLang's name, and vLLM's since 2026 (either is read; cascade/service/bodies.py
    # keeps it as `reasoning_content`, and cascade/tiers/thinking.py sends the engine the name it reads).
    reasoning_content: str | None = None
    reasoning: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    include_usage: bool = False
    # OpenAI pads stream chunks with an `obfuscation` field unless this is false; cascade's chunks carry none, so
    # true is dropped (cascade/service/dropped.py) and never sent to an engine.
    include_obfuscation: bool | None = None


# `reasoning_effort`'s named levels: OpenAI's (none to high, xhigh), and SGLang's and vLLM's `max` and SGLang's `ultra`
# (DeepSeek's). SGLang also takes a number in [0, EFFORT_NUMBER_MAX]. Each level routes as `[routing.effort]` says
# (cascade/router/effort.py), a number as the level its range falls in (EFFORT_NUMBER_LEVELS).
EFFORT_LEVELS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")
EFFORT_NUMBER_MAX = 0.99  # SGLang's bound (protocol.py `ReasoningEffortType`)
# A number's level: the first whose upper bound (exclusive) it is below; `high` from 0.75 up.
EFFORT_NUMBER_LEVELS = ((0.25, "minimal"), (0.5, "low"), (0.75, "medium"), (math.inf, "high"))


class ReasoningRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The nested form of `reasoning_effort` (the Responses API's, which SGLang and vLLM also read on chat
    completions): `{"reasoning": {"effort": "high"}}`."""

    effort: str | float | None = None


class Effort(msgspec.Struct, frozen=True, kw_only=True):
    """A request's reasoning effort as cascade read it (cascade/router/effort.py `read_effort`)."""

    level: str  # one of EFFORT_LEVELS (a number's: EFFORT_NUMBER_LEVELS)
    value: str | float  # as the client meant it: the level's name, or the number
    param: str  # where it was read: `reasoning_effort` or `reasoning.effort`
    # Whether the tier's engine is asked to think ([routing.effort]: every level but `none`, by default).
    thinking: bool = True


class BranchOverride(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """cascade's extension: per-request reasoning-branch settings, within the gateway's limits. Each is the tier's
    `[tiers.branches]` setting of the same name (cascade/config/branches.py), checked by the same rules."""

    n: int | None = None
    m: int | None = None
    alpha: float | None = None
    beta: int | None = None
    k: int | None = None  # score every k reasoning steps
    aggregation: Literal["majority", "weighted"] | None = None


class ChatCompletionRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The request body. Fields cascade does not interpret itself are forwarded to the tier's engine as
    sent (PASSTHROUGH); truly unknown fields are refused with their name."""

    model: str
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # OpenAI's prefix-cache routing key: read by cascade to pick a tier's replica ([tiers.replicas] choice =
    # "prefix"; an `x-session-id` header means the same), never sent upstream.
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # A quality hint as OpenAI's clients give one (cascade/router/effort.py: below an explicit cascade hint), and what
    # the tier's engine is told about thinking (cascade/tiers/thinking.py). A level (EFFORT_LEVELS) or a number.
    reasoning_effort: str | float | None = None
    reasoning: ReasoningRequest | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # Engine extensions that SGLang and vLLM share.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stop_token_ids: list[int] | None = None  # at most [gateway.limits] max_stop_token_ids, each a token id
    # ... which are sent only to a tier whose engines take them (DROPPED_WHERE_UNTAKEN).
    ignore_eos: bool | None = None
    min_tokens: int | None = None  # 0 to the token limit
    skip_special_tokens: bool | None = None
    # OpenAI's own, which no engine takes (OPENAI_ONLY): never sent, and dropped with a word where they ask for
    # something cascade does not do.
    store: bool | None = None
    service_tier: str | None = None  # at most SERVICE_TIER_CHARS characters
    verbosity: Literal["low", "medium", "high"] | None = None
    # cascade's own extension: a named operating point or a numeric accuracy target in (0, 1].
    quality: str | float | None = None
    # cascade's own extension: override the served tier's reasoning-branch settings.
    branches: BranchOverride | None = None

    @property
    def token_limit(self) -> int | None:
        """The tokens an answer may generate, its reasoning included (None: the tier's default):
        `max_completion_tokens`, OpenAI's limit (it deprecated `max_tokens`; SGLang and vLLM read it first), else
        `max_tokens`. The reservation, the branch runner and every engine get this one (cascade/service/validation.py
        `limit_note`)."""
        return self.max_completion_tokens or self.max_tokens


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0  # of the prompt's, served from the engine's prefix cache


class CompletionTokensDetails(msgspec.Struct, kw_only=True):
    # Of the answer's completion tokens, those of its reasoning text: the engine's count where it reports one (SGLang),
    # else counted (cascade/service/reasoning.py).
    reasoning_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # As OpenAI reports it; only where the answering engine reported its cached tokens (SGLang, vLLM), else absent.
    prompt_tokens_details: PromptTokensDetails | msgspec.UnsetType = msgspec.UNSET
    # As OpenAI reports it: in every answer's usage (absent only where cascade relays an engine's usage unread).
    completion_tokens_details: CompletionTokensDetails | msgspec.UnsetType = msgspec.UNSET


class BranchStats(msgspec.Struct, kw_only=True):
    configured: int = 1
    launched: int = 1
    finished: int = 0
    pruned: int = 0
    early_stopped: int = 0
    pruned_phase1: int = 0
    pruned_phase2: int = 0
    pruned_confidence: int = 0  # stopped by their token-logprob group confidence (prune_confidence)
    failed: int = 0
    decode_tokens: int | None = None  # all branches' generated tokens, pruned and stopped ones included
    votes: dict[str, int] | None = None  # answer -> finished branches giving it


class Degradation(msgspec.Struct, frozen=True, kw_only=True):
    """Why a request was served below what it asked for: load-reactive routing (cascade/router/load.py)."""

    requested: str  # the hint's operating point
    served: str  # the operating point used
    tier: str  # the pressed tier it kept the request off (or whose branches it cut)
    reason: str  # what pressed it, e.g. "ttft p90 1.20 s against the 1.00 s SLO"
    branches: int | None = None  # the reasoning branches run instead of the tier's own (None: unchanged)


class Billed(msgspec.Struct, kw_only=True):
    """What the request's API key is charged (`cascade.billed`, header x-cascade-billed-tokens): the prompt once per
    tier that answered (an escalated draft's and the final answer's) and every token the engines decoded for it:
    every branch (pruned and stopped ones included), every escalated draft, every retry that produced tokens, a
    stream up to where it was cut. `usage` keeps OpenAI's meaning: the returned answer's tokens."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Cost(msgspec.Struct, kw_only=True):
    """What the request cost (`cascade.cost`, header x-cascade-cost): its bill (`billed`) priced per tier at the
    tiers' `[tiers.price]`, in `currency` units: `input` its prompt tokens (once per tier that answered), `output`
    every token decoded for it (every branch, escalated draft and retry), `total` the two. Absent when the tiers have
    no prices."""

    currency: str
    input: float
    output: float
    total: float
    # Each tier's share of `total` (the tiers it was answered on: an escalation's draft tiers too).
    tiers: dict[str, float] = msgspec.field(default_factory=dict)


class CascadeInfo(msgspec.Struct, kw_only=True):
    """What cascade decided for this request; returned in every response."""

    tier: int
    tier_name: str
    quality: str
    difficulty: float | None = None  # p_fail of tier 0 (learned router) or the heuristic's difficulty
    route_score: float | None = None  # what the operating point's thresholds were compared with
    escalations: int = 0
    # Cascade mode: confidence of the accepted answer (cascade/router/acceptance.py).
    confidence: float | None = None
    router: str = ""
    # The learned router found the prompt unlike its training prompts; `router` is then "heuristic".
    out_of_domain: bool = False
    branches: BranchStats = msgspec.field(default_factory=BranchStats)
    note: str | None = None
    # Failover: faulty replicas tried before the answering one (summed over choices), and the tier that
    # failed when route mode answered on the nearest healthy tier instead (`tier` is the one that answered).
    retries: int = 0
    fallback_from: str | None = None
    # Load-reactive routing served it at a cheaper operating point or with fewer branches (None: as asked).
    degraded: Degradation | None = None
    # What its API key is charged (whole answers, and a stream's last chunk; None: not known yet).
    billed: Billed | None = None
    # What it cost: `billed` priced per tier (None: the tiers have no prices, or not known yet).
    cost: Cost | None = None


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None
    # The reasoning text under each name `[gateway] reasoning_fields` lists (both by default), whichever the engine
    # sent; a name not listed is absent.
    reasoning_content: str | msgspec.UnsetType | None = None
    reasoning: str | msgspec.UnsetType | None = None
    tool_calls: list[ToolCall] | None = None


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    """The engine's token logprobs, entries as it sent them ({token, logprob, bytes, top_logprobs})."""

    content: list[msgspec.Raw] | None = None


class Choice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    cascade: CascadeInfo | None = None


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None  # as AssistantMessage's
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    # No default: omit_defaults would drop a defaulted `object`, and OpenAI's chunks always carry it.
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    cascade: CascadeInfo | None = None


class RouteDecision(msgspec.Struct, kw_only=True):
    """`POST /v1/route`: what the gateway would do with a chat request, without generating."""

    object: Literal["cascade.route"] = "cascade.route"
    tier: int
    tier_name: str
    quality: str
    # "learned", "heuristic", "random", or "bypass" (the request named a tier). "heuristic" with `out_of_domain`: the
    # learned router found the prompt unlike its training prompts (its p_fail is still given).
    router: str
    out_of_domain: bool = False
    difficulty: float | None = None
    route_score: float | None = None
    p_fail: dict[str, float] | None = None  # per tier (learned router)
    # The operating point's; null for a threshold that is never reached (infinite: JSON has no infinity).
    thresholds: list[float | None] | None = None
    # What the decision's `cascade.note` would say (why an out-of-domain prompt's tier is not its p_fail's, a budget's
    # downgrade, a permit's tier); null: nothing to say.
    note: str | None = None


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "cascade"


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard] = msgspec.field(default_factory=list)


class ErrorBody(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorBody


class TrafficRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the gateway's traffic log (`[gateway] traffic_log`): a served request, no text."""

    ts: float  # unix time the request was answered
    hint: str
    router: str
    tier: int
    tier_name: str
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    stream: bool = False
    difficulty: float | None = None
    route_score: float | None = None
    p_fail: list[float] | None = None
    out_of_domain: bool = False  # routed by the heuristic: the learned router's domain check
    escalations: int = 0
    branches: int = 1
    decode_tokens: int | None = None  # all branches' tokens, when the tier ran branches


# Request fields cascade forwards to the tier's engine as sent, without acting on them itself.
PASSTHROUGH = ("presence_penalty", "frequency_penalty", "logit_bias", "user", "metadata", "logprobs", "top_logprobs",
               "tools", "tool_choice", "parallel_tool_calls", "response_format", "top_k", "min_p",
               "repetition_penalty", "chat_template_kwargs", "stop_token_ids")
# Engine extras SGLang and vLLM share that change an answer's length or rendering, not its meaning: forwarded to a tier
# whose engines take them; a backend lists the ones its engine does not take in `unsupported_params` (the embedded
# engine, all three), and its engine then does not get them, the response saying so (cascade/service/dropped.py).
# Each with the value every engine decodes with anyway: sent or not, that value asks for nothing.
DROPPED_WHERE_UNTAKEN: dict[str, object] = {"ignore_eos": False, "min_tokens": 0, "skip_special_tokens": True}
# OpenAI's own fields that no engine takes: never sent to one. Each with the values cascade serves as asked; any other
# is dropped, the response saying so (cascade/service/dropped.py).
OPENAI_ONLY: dict[str, tuple[object, ...]] = {
    "store": (False,),  # cascade stores no chat completions
    "service_tier": ("auto", "default"),  # cascade has one service tier
    "verbosity": ("medium",),  # OpenAI's default; no engine takes another
    "stream_options.include_obfuscation": (False,),  # cascade's chunks carry no obfuscation padding
}
SERVICE_TIER_CHARS = 32  # OpenAI's names are at most 8
MAX_TOKEN_ID = 2**31 - 1  # a stop_token_ids entry: 0 to this (an int32, as engines hold token ids)
# Request fields cascade acts on itself and also sends to a tier's engine that takes them: a backend may list them in
# `unsupported_params`, and its engine then does not get them, the request not refused (`cascade.note` says so).
SENT_WHERE_TAKEN = ("reasoning_effort",)
# Names an answer may carry its reasoning text under (`[gateway] reasoning_fields`).
REASONING_FIELDS = ("reasoning_content", "reasoning")
# Fixed ranges of forwarded values, as OpenAI and SGLang define them (the counts and lengths are [gateway.limits]):
# cascade/service/validation.py `engine_bounds` checks them, the OpenAPI document states them.
PENALTY = 2.0  # presence_penalty, frequency_penalty in [-2, 2]
LOGIT_BIAS = 100.0  # each logit_bias value in [-100, 100]
TOKEN_ID_DIGITS = 9  # a logit_bias key: a token id, 1 to 9 ASCII digits (below 10^9: any vocabulary)
MAX_TOP_K = 2**30  # top_k: -1 (no limit) or 1 to SGLang's "the whole vocabulary" (sampling_params.py TOP_K_ALL)
# ... of which these shape the answer itself (tool calls, a JSON format, per-token logprobs): a request that
# sets one gets the engine's one answer, never a vote over several branches.
ONE_ANSWER = ("logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "response_format")
