"""What one answer sends upstream: a request's sampling turned into one GenerationRequest per choice and branch,
each with its own seed and its own request id. Every caller that sends a tier's answer upstream (the gateway,
`cascade label`, `cascade bench`, through cascade/tiers/answer.py) gets its requests here, so that the rules below hold
everywhere and a streamed answer sends exactly what a whole one does.

* `Sampling`: how to sample, from a client's request (`sampling_of`), `cascade label` (`label_sampling`) or
  `cascade bench` (its own decoding);
* `template`: what a tier sends for it: the tier's reasoning instruction first, its default length, the
  forwarded fields, and token logprobs when cascade itself reads them;
* `engine_fields`: the tier's own rules for anything sent to its engines (its instruction first, its default length),
  written once: `template` applies them, and so does `engine_request`, a client's request rewritten for the tier's
  engine in the OpenAI schema (the Envoy model picker's body, cascade/extproc/picker.py);
* `engine_template_kwargs`: a client's `chat_template_kwargs` as the tier's engines get them: without the keys that
  name or carry a chat template (`template_keys`) unless the tier trusts them (`trust_request_chat_template`), in
  both of those bodies (docs/operations.md, "What reaches an engine");
* what the engines are told of the request's reasoning effort (thinking on or off, its budget, `reasoning_effort`)
  and the history's reasoning field: cascade/tiers/thinking.py, in both bodies too;
* `choice_requests` / `branch_requests`: the template per choice and branch, with seeds and rids.

Seeds (distinct samples, reproducible: `cascade label` labels exactly what the gateway serves):

* choice `c` of a single-branch answer sends `seed + c` (no seed: the engine picks);
* branch `b` of choice `c`, with `n` branches per choice, sends `base + c * n + b`, where `base` is the
  request's seed or a random one (branches must differ even when the client gave no seed).

Request ids (SGLang's `rid`): ``<base>-c<choice>-b<branch>``, e.g. ``cascade-3f2a...e1-c01-b07``,
readable in SGLang's logs. SGLang needs them distinct and prefix-free (srt/managers/tokenizer_manager.py):

* a rid already in flight is refused, ``400 Duplicate request ID detected: <rid>``;
* ``/abort_request`` aborts every request in flight whose rid *starts with* the given one (and so does
  SGLang's own abort of a request whose client went away).

Prefix-free by construction: `base` is ``cascade-`` and the 32 hex digits of a fresh uuid4 per answer,
and one answer pads its choice and branch numbers to widths fixed by its own counts, so all its rids have
the same length; two distinct strings of the same length are never prefixes of one another. Two answers'
rids differ within their bases. The bare base is never sent.
"""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import msgspec

from cascade.branches.backend import GenerationRequest
from cascade.branches.confidence import LOGPROBS_REQUEST
from cascade.config import TierConfig
from cascade.schemas import DROPPED_WHERE_UNTAKEN, PASSTHROUGH, ChatCompletionRequest, ChatMessage, Effort
from cascade.tiers.thinking import SGLANG_BUDGET, VLLM_BUDGET, effort_fields, history_messages

_encode = msgspec.json.Encoder().encode
RID_PREFIX = "cascade-"
# A `chat_template_kwargs` key naming or carrying a chat template rather than setting one of its variables: every
# engine passes the kwargs on to the tokenizer's `apply_chat_template`, whose `chat_template` argument is Jinja text
# or the name of one of the model's templates (SGLang reads it from a request behind --trust-request-chat-template,
# vLLM refuses it, `transformers serve` renders it). Any key with one of these in its name counts, so that no
# spelling of a template or a template's file reaches an engine; the variables templates read (enable_thinking,
# thinking, reasoning_effort, ...) do.
TEMPLATE_MARKS = ("template", "jinja")
# A client's fields sent on as they are (`template` leaves out the extras a tier's engines do not take).
_SENT = (*PASSTHROUGH, *DROPPED_WHERE_UNTAKEN)
_MIN_WIDTH = 2  # `c00-b07`: aligned in logs for the usual counts, wider only when a count needs it


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample: the request's own fields (None leaves the choice to the engine or the tier)."""

    max_tokens: int | None = None  # None: the tier's default_max_tokens
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    seed: int | None = None
    # Forwarded request fields (tools, logprobs, response_format, ...): cascade.schemas.PASSTHROUGH, and the extras
    # sent only where taken (DROPPED_WHERE_UNTAKEN; `template` leaves out those a tier's engines do not take).
    extra: dict[str, object] = msgspec.field(default_factory=dict)
    # Ask the engine for token logprobs for cascade's own reading (answer confidence, pruning): LOGPROBS_REQUEST.
    token_logprobs: bool = False
    # The client's prefix-cache key (`prompt_cache_key` or `x-session-id`): GenerationRequest.affinity_key.
    affinity_key: str = ""
    # With token_logprobs: candidates per token to ask for (`top_logprobs`) where more than LOGPROBS_REQUEST's one
    # (DeepConf's token confidence, `[tiers.branches] confidence_top_k`).
    top_logprobs: int = 0
    # The request's reasoning effort, as `[routing.effort]` reads it (None: it set none): cascade/tiers/thinking.py.
    effort: Effort | None = None


def sampling_of(req: ChatCompletionRequest, max_tokens: int, effort: Effort | None = None) -> Sampling:
    """A client's request as sampling (`max_tokens` 0: the tier's default; `effort`: its reasoning effort as the
    service read it, cascade/router/effort.py)."""
    extra = {name: value for name in _SENT if (value := getattr(req, name)) is not None}
    return Sampling(max_tokens=max_tokens or None, temperature=req.temperature, top_p=req.top_p, stop=stops(req),
                    seed=req.seed, extra=extra, affinity_key=req.prompt_cache_key or "", effort=effort)


def label_sampling(max_tokens: int | None, seed: int, branched: bool, token_logprobs: bool = False) -> Sampling:
    """What `cascade label` asks a tier: the prompt sent with `seed`, decoded greedily on a single-branch tier so
    that its row is reproducible (a tier with reasoning branches samples them at its branch temperature, seeded)."""
    return Sampling(max_tokens=max_tokens, temperature=None if branched else 0.0, seed=seed,
                    token_logprobs=token_logprobs)


def stops(req: ChatCompletionRequest) -> list[str]:
    return [req.stop] if isinstance(req.stop, str) else list(req.stop or [])


def engine_fields(tier: TierConfig, messages: list[ChatMessage], max_tokens: int | None
                  ) -> tuple[list[ChatMessage], int]:
    """What `tier` makes of any request for its engines: `messages` after its reasoning instruction (its system
    prompt), and `max_tokens`, or its default length when the request set none (None)."""
    if tier.system_prompt:
        messages = [ChatMessage(role="system", content=tier.system_prompt), *messages]
    return messages, max_tokens or tier.default_max_tokens


def template_keys(kwargs: dict[str, Any] | None) -> list[str]:
    """The keys of a request's `chat_template_kwargs` that name or carry a chat template (TEMPLATE_MARKS)."""
    return [key for key in kwargs or () if any(mark in key.casefold() for mark in TEMPLATE_MARKS)]


def engine_template_kwargs(tier: TierConfig, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """A client's `chat_template_kwargs` as `tier`'s engines get them: without its `template_keys` unless the tier
    trusts a request's template (`trust_request_chat_template`); None when nothing is left."""
    if tier.trust_request_chat_template or not (dropped := template_keys(kwargs)):
        return kwargs
    assert kwargs is not None
    kept = {key: value for key, value in kwargs.items() if key not in dropped}
    return kept or None


def engine_request(req: ChatCompletionRequest, tier: TierConfig, model: str, effort: Effort | None = None
                   ) -> ChatCompletionRequest:
    """A client's request as `tier`'s engine takes it in the OpenAI schema: `model` the engine's, the tier's
    `engine_fields` (its default length only when the client set neither `max_tokens` nor `max_completion_tokens`;
    both as the limit, `max_completion_tokens`, when the client set both), its `engine_template_kwargs`, what it
    tells its engines of `effort` (the request's reasoning effort; its budget is `engine_body`'s), without cascade's
    own fields (`quality`, `branches`, `prompt_cache_key`), OpenAI's that no engine takes (schemas.OPENAI_ONLY) and
    the extras its engines do not take (`TierConfig.untaken`), and with the effort only at the top
    (`reasoning_effort`)."""
    messages, length = engine_fields(tier, history_messages(tier, req.messages), req.max_tokens)
    limit = req.max_completion_tokens
    max_tokens = length if limit is None else limit if req.max_tokens is not None else None
    kwargs = engine_template_kwargs(tier, req.chat_template_kwargs)
    told = {} if effort is None else effort_fields(tier, effort, kwargs)
    options = req.stream_options and msgspec.structs.replace(req.stream_options, include_obfuscation=None)
    return msgspec.structs.replace(req, model=model, messages=messages, quality=None, branches=None,
                                   prompt_cache_key=None, max_tokens=max_tokens, reasoning=None,
                                   reasoning_effort=told.get("reasoning_effort"),
                                   chat_template_kwargs=told.get("chat_template_kwargs", kwargs),
                                   store=None, service_tier=None, verbosity=None, stream_options=options,
                                   **dict.fromkeys(tier.untaken))


def engine_body(req: ChatCompletionRequest, tier: TierConfig, model: str, effort: Effort | None = None) -> bytes:
    """`engine_request`'s JSON, with the effort's thinking budget where the tier sets one (fields no client sends)."""
    body = _encode(engine_request(req, tier, model, effort))
    told = {} if effort is None else effort_fields(tier, effort, None)
    budget = {k: told[k] for k in (SGLANG_BUDGET, VLLM_BUDGET) if k in told}
    return body if not budget else body[:-1] + b"," + _encode(budget)[1:]


def template(tier: TierConfig, messages: list[ChatMessage], sampling: Sampling) -> GenerationRequest:
    """What `tier` sends upstream for `messages`: its `engine_fields` (its reasoning instruction first, its default
    length), its `engine_template_kwargs`, what it tells its engines of the effort, a fresh rid base. A template:
    `choice_requests` / `branch_requests` turn it into the requests sent. The extras its engines do not take
    (`TierConfig.untaken`) are left out."""
    messages, max_tokens = engine_fields(tier, history_messages(tier, messages), sampling.max_tokens)
    extra = {**sampling.extra, **LOGPROBS_REQUEST} if sampling.token_logprobs else dict(sampling.extra)
    for name in tier.untaken:
        extra.pop(name, None)
    kwargs = extra.pop("chat_template_kwargs", None)
    kept = engine_template_kwargs(tier, kwargs) if isinstance(kwargs, dict) else None
    if kept is not None:
        extra["chat_template_kwargs"] = kept
    if sampling.effort is not None:
        extra.update(effort_fields(tier, sampling.effort, kept))
    if sampling.token_logprobs and sampling.top_logprobs > 1:
        extra["top_logprobs"] = sampling.top_logprobs
    return GenerationRequest(
        messages=messages, max_tokens=max_tokens,
        temperature=sampling.temperature, top_p=sampling.top_p, stop=list(sampling.stop), seed=sampling.seed,
        request_id=new_base(), extra=extra, affinity_key=sampling.affinity_key,
    )


def new_base() -> str:
    """A fresh request-id base for one answer (its template's `request_id`)."""
    return f"{RID_PREFIX}{uuid.uuid4().hex}"


def rid(base: str, choice: int, branch: int, choices: int, branches: int) -> str:
    """The request id of `branch` of `choice`, in an answer of `choices` x `branches` upstream requests."""
    if not (0 <= choice < choices and 0 <= branch < branches):
        raise ValueError(f"choice {choice} / branch {branch} outside {choices} x {branches}")
    return f"{base}-c{choice:0{_width(choices)}d}-b{branch:0{_width(branches)}d}"


def _width(count: int) -> int:
    return max(_MIN_WIDTH, len(str(count - 1)))


def choice_requests(template: GenerationRequest, choices: int) -> list[GenerationRequest]:
    """A single-branch answer's upstream requests: one per choice."""
    base = template.request_id or new_base()
    return [
        msgspec.structs.replace(template, seed=None if template.seed is None else template.seed + c,
                                request_id=rid(base, c, 0, choices, 1))
        for c in range(choices)
    ]


def branch_requests(template: GenerationRequest, choices: int, branches: int,
                    temperature: float | None = None) -> list[list[GenerationRequest]]:
    """A branched answer's upstream requests: per choice, its `branches` requests, at `temperature` when
    given (else the template's)."""
    base = template.request_id or new_base()
    first = template.seed if template.seed is not None else secrets.randbelow(1 << 31)
    fields = {} if temperature is None else {"temperature": temperature}
    return [
        [msgspec.structs.replace(template, seed=first + c * branches + b,
                                 request_id=rid(base, c, b, choices, branches), **fields)
         for b in range(branches)]
        for c in range(choices)
    ]
