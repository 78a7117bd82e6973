"""A fake SGLang engine that emulates a GPU from a measured profile: `GpuSGLang`.

It speaks the strict fake's wire (cascade/testing/fakes/sglang.py: SGLang's OpenAI chat route and shapes, `rid`,
`/abort_request`, `/health`, `/get_model_info`, `/server_info`, `/metrics`, streaming) and times every token by a
continuous-batching scheduler that takes the profile's time per iteration (cascade/testing/fakes/gpu_batch.py): a
request waits in the queue while the KV cache is full, prefills with the others admitted with it, then gets one
token per decode step of the whole batch. An abort (`/abort_request` with its rid, or a client gone for
`disconnect_abort_s`) frees its KV at once.

What a request answers comes from an `AnswerSource` (cascade/testing/fakes/answers.py; default: as many tokens as its
max_tokens allows). Its prompt is counted one token per whitespace-separated word of its messages (the prompts
`cascade profile` sends are built that way), and usage reports that count.

`/metrics` publishes SGLang's scheduler gauges: `sglang:num_running_reqs`, `num_queue_reqs`, `token_usage` (KV slots
held / `max_total_num_tokens`), `num_used_tokens`, `kv_used_tokens`, `kv_available_tokens`, `num_retracted_reqs`
(cumulative here), besides the TTFT histogram. `GET /fake/gpu` reports the scheduler's state, its recent steps, and
`lag_s`: emulated time lost because the event loop ran late (non-zero: this CPU could not keep the emulated GPU's pace;
raise `time_scale`).

Start one with `cascade fake-server --gpu-profile PROFILE.json [--time-scale S] [--kv-capacity-tokens N]
[--answer-tokens N] [--recorded OUTCOMES.jsonl:TIER]` (`serve`; recorded answers:
cascade/testing/fakes/recorded.py), or in-process with cascade.testing.asgi.serve_asgi(GpuSGLang(profile)).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from cascade.engines.asgi import Receive, Scope, Send, send_json
from cascade.optimizer.profile import Profile
from cascade.testing.fakes import sglang_shapes as shapes
from cascade.testing.fakes.answers import AnswerSource, LengthAnswers
from cascade.testing.fakes.gpu_batch import GpuBatcher, Sequence
from cascade.testing.fakes.script import FakeScript
from cascade.testing.fakes.sglang import FakeSGLang, Generation
from cascade.testing.fakes.sglang_metrics import FakeScheduler

UNSET_MAX_TOKENS = 128  # SGLang's SamplingParams.max_new_tokens default


class GpuScheduler(FakeScheduler):
    """The fake SGLang's /metrics, with the gauges read off the emulated GPU's scheduler."""

    def __init__(self, model: Callable[[], str], gpu: GpuBatcher) -> None:
        super().__init__(model)
        self.gpu = gpu

    def gauges(self) -> list[tuple[str, float]]:
        g = self.gpu
        used = g.used_tokens
        return [("sglang:num_running_reqs", len(g.running)), ("sglang:num_queue_reqs", len(g.waiting)),
                ("sglang:token_usage", used / g.capacity), ("sglang:num_used_tokens", used),
                ("sglang:kv_used_tokens", used), ("sglang:kv_available_tokens", g.capacity - used),
                ("sglang:num_retracted_reqs", g.retracted)]


class GpuSGLang(FakeSGLang):
    """`profile` times the steps; `answers` plans what each request generates; `time_scale` is wall seconds per
    emulated second; `kv_capacity_tokens` overrides the profile's KV cache size; `model` the served model name (default:
    the profile's)."""

    def __init__(self, profile: Profile, answers: AnswerSource | None = None, *, time_scale: float = 1.0,
                 kv_capacity_tokens: int | None = None, max_running: int = 0, disconnect_abort_s: float = 2.0,
                 keep_steps: int = 0, model: str = "", stream_interval: int = 1) -> None:
        super().__init__(FakeScript(model=model or profile.model), disconnect_abort_s=disconnect_abort_s)
        self.gpu = GpuBatcher(profile, kv_capacity_tokens=kv_capacity_tokens, time_scale=time_scale,
                              max_running=max_running, keep_steps=keep_steps, stream_interval=stream_interval)
        self.answers = answers or LengthAnswers(unset_max_tokens=UNSET_MAX_TOKENS)
        self.scheduler = GpuScheduler(lambda: self.script.model, self.gpu)
        self.max_total_num_tokens = self.gpu.capacity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (scope.get("method"), scope.get("path")) == ("GET", "/fake/gpu"):
            await send_json(send, 200, self.state())
        else:
            await super().__call__(scope, receive, send)

    def state(self) -> dict[str, Any]:
        g = self.gpu
        return {"running": len(g.running), "queued": len(g.waiting), "used_tokens": g.used_tokens,
                "kv_capacity_tokens": g.capacity, "retracted": g.retracted, "gpu_s": g.gpu_s, "lag_s": g.lag_s,
                "new_token_ratio": g.ratio, "steps": msgspec.to_builtins(g.steps)}

    def plan(self, body: dict[str, Any], script: FakeScript) -> tuple[list[shapes.Step], str]:
        prompt, limit = self.prompt_tokens(body), self.gpu.capacity - 1
        if prompt >= limit:  # SGLang's validate_input_length (max_req_input_len <= max_total_num_tokens - 1)
            raise ValueError(f"Input length ({prompt} tokens) exceeds the maximum allowed length ({limit} tokens). "
                             "Use a shorter input or enable --allow-auto-truncate.")
        answer = self.answers.answer(body)
        return list(answer.steps), answer.finish

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        return max(1, sum(len(text.split()) for text in _texts(body.get("messages"))))

    async def produce(
        self, generation: Generation, script: FakeScript, tokens: list[tuple[str, str]],
        emit: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        if not tokens:
            return
        seq = Sequence(generation.rid, generation.prompt_tokens, len(tokens),
                       generation.max_new_tokens or UNSET_MAX_TOKENS)
        self.gpu.submit(seq)
        stopper = asyncio.ensure_future(generation.stopped.wait())
        stopper.add_done_callback(lambda _: self.gpu.abort(seq))
        try:
            while generation.tokens < len(tokens):
                out = await seq.progress(generation.tokens)
                if generation.stopped.is_set():
                    return
                for field, text in tokens[generation.tokens:out]:
                    generation.tokens += 1
                    self.stats.tokens_sent += 1
                    if emit is not None:
                        await emit(field, text)
                if seq.finished:
                    return
        finally:
            stopper.cancel()
            self.gpu.abort(seq)  # a request that ends any other way (its task cancelled) frees its KV too


def _texts(messages: Any) -> list[str]:
    """Every text of a chat request's messages (string contents and text parts)."""
    texts: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [str(p.get("text") or "") for p in content if isinstance(p, dict)]
    return texts


def serve(host: str, port: int, profile: Profile, *, time_scale: float = 1.0, kv_capacity_tokens: int | None = None,
          answer_tokens: int | None = None, max_running: int = 0, model: str = "",
          answers: AnswerSource | None = None) -> None:
    """Run the emulated engine until interrupted (`cascade fake-server --gpu-profile`); `answers` (default: answers
    of `answer_tokens` tokens) says what it answers."""
    import uvicorn

    answers = answers or LengthAnswers(answer_tokens, UNSET_MAX_TOKENS)
    engine = GpuSGLang(profile, answers, time_scale=time_scale,
                       kv_capacity_tokens=kv_capacity_tokens, max_running=max_running, model=model)
    uvicorn.run(engine, host=host, port=port, log_level="warning", access_log=False)
