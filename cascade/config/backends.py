"""A tier's `backends`: the engines that answer it (an OpenAI-compatible server, SGLang, or a worker that
`cascade serve` starts), told apart by their `kind`, and the timeouts of a call to one."""

from __future__ import annotations

from cascade.config.base import Name, PositiveFloat, Strict


class Timeouts(Strict, frozen=True):
    connect_s: PositiveFloat = 5.0
    # Longest silence allowed between bytes of a response (first token included).
    read_s: PositiveFloat = 120.0
    # Whole request, first byte to last.
    total_s: PositiveFloat = 900.0
    # An SGLang backend's GET /health: SGLang answers it after a one-token generation, polled once a second
    # for up to SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s), so 1-20 s; longer than that is a hung engine.
    health_s: PositiveFloat = 30.0


# What `transformers serve` (the embedded engine) ignores or refuses among the fields cascade forwards
# (its UNUSED_CHAT_COMPLETION_FIELDS, and its params class: a field outside it is a 422): requests setting them get a
# 400, not a silently different answer, but for `reasoning_effort` and the length and rendering extras
# (schemas.DROPPED_WHERE_UNTAKEN), which are only not sent. `user` and `metadata` it ignores too, but they change
# nothing in the answer.
TRANSFORMERS_SERVE_UNSUPPORTED = ("logprobs", "top_logprobs", "response_format", "tool_choice", "parallel_tool_calls",
                                  "presence_penalty", "reasoning_effort", "top_k", "min_p", "repetition_penalty",
                                  "stop_token_ids", "ignore_eos", "min_tokens", "skip_special_tokens")


class OpenAIBackendConfig(Strict, frozen=True, tag="openai", tag_field="kind"):
    """Any OpenAI-compatible server (transformers serve, vLLM, llama.cpp, SGLang's OpenAI routes)."""

    url: str
    model: str
    api_key: str = ""
    timeouts: Timeouts = Timeouts()
    # Forwarded request fields (schemas.PASSTHROUGH) this engine ignores: a request setting one is refused
    # with a 400 naming it, instead of silently getting an answer without it. `reasoning_effort` and the length and
    # rendering extras (schemas.DROPPED_WHERE_UNTAKEN) are only not sent, and the response says so.
    unsupported_params: tuple[str, ...] = ()


class SGLangBackendConfig(Strict, frozen=True, tag="sglang", tag_field="kind"):
    """An SGLang server: OpenAI routes for chat plus its native `/abort_request`."""

    url: str
    model: str = ""
    api_key: str = ""
    timeouts: Timeouts = Timeouts()
    unsupported_params: tuple[str, ...] = ()  # as for kind = "openai"


class WorkerBackendConfig(Strict, frozen=True, tag="worker", tag_field="kind"):
    """A worker that `cascade serve` starts itself (see [[workers]]); resolved to an OpenAI backend."""

    worker: Name
    timeouts: Timeouts = Timeouts()
    unsupported_params: tuple[str, ...] = TRANSFORMERS_SERVE_UNSUPPORTED


BackendConfig = OpenAIBackendConfig | SGLangBackendConfig | WorkerBackendConfig
