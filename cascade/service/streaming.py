"""Streamed answers as SSE frames: a live relay of upstream deltas, or a whole answer sent when known.

* `relay`: a live answer (cascade/tiers/answer.py `Opened`: one tier's upstream streams, their first deltas read, so a
  fault before any token became an HTTP error or a fallback), relayed frame by frame; the hot path of the gateway.
  Its `StreamAnswerer` closes it at the end: the upstreams, the tier's slots and admission.
* `deferred`: an answer known only at the end (cascade mode judges it, reasoning branches vote, on the first tier or
  a route-mode fallback's), served by a `WholeAnswerer`: SSE comments keep the connection alive meanwhile, then
  the answer goes out at once, so TTFT honestly includes the wait.

Headers are gone once a frame is out: a later fault ends the stream with an in-band error event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable

from cascade.branches.backend import GenerationResult, StreamDelta
from cascade.errors import BackendError, CascadeError, Overloaded, UsageFault
from cascade.service.answerers import StreamAnswerer
from cascade.service.decision import Decision
from cascade.service.frames import ChunkFrames
from cascade.service.keys.bill import Bill
from cascade.service.reasoning import ReasoningSeen, ReasoningShown
from cascade.service.responses import cascade_info, completion_id, in_band_error, whole_answer_frames
from cascade.service.responses import usage as usage_with
from cascade.service.telemetry import Telemetry
from cascade.tiers.answer import Answer, Opened, Streams

# SSE comment sent while a cascade (or branches) works before the first token: proxies and clients
# with idle timeouts keep the connection, and OpenAI SDKs ignore comments.
KEEPALIVE = b": keep-alive\n\n"


async def relay(opened: Opened, answerer: StreamAnswerer, decision: Decision, include_usage: bool, telemetry: Telemetry,
                bill: Bill, shown: ReasoningShown) -> AsyncGenerator[bytes, None]:
    """The frames of `opened`'s streams, reasoning shown as `shown` says; `answerer` closes it at the end, whatever
    ends it. The tokens relayed are billed however it ends (to where a client that left cut it), before the last
    chunk, which carries the bill and its cost (and the usage, with the reasoning tokens, when asked for)."""
    tier, streams, firsts, start = opened.tier, opened.streams, opened.firsts, opened.start
    frames = ChunkFrames(completion_id(), int(time.time()), tier.name, shown.names)
    # Each choice's reasoning, for the usage chunk: its text kept only where the tier's tokenizer may count it.
    seen = [ReasoningSeen(bool(tier.model_dirs)) for _ in streams] if include_usage else None
    prompt_tokens = 0
    prompts = [0] * len(streams)  # each choice's upstream request processed the prompt once
    completion_tokens = [0] * len(streams)
    finished = 0
    first_token_at: float | None = None
    cached_tokens: int | None = None
    retries = sum(f.retries for f in firsts if f is not None)

    def frame_for(index: int, delta: StreamDelta) -> bytes:
        nonlocal prompt_tokens, finished, first_token_at, cached_tokens
        if delta.prompt_tokens is not None:
            prompt_tokens = prompts[index] = delta.prompt_tokens
        if delta.cached_tokens is not None:
            cached_tokens = delta.cached_tokens
        if delta.completion_tokens is not None:
            completion_tokens[index] = delta.completion_tokens
        if seen is not None and (delta.reasoning or delta.reasoning_tokens is not None):
            seen[index].saw(delta)
        frame = b""
        if delta.text or delta.reasoning or delta.tool_calls or delta.logprobs:
            if first_token_at is None:
                first_token_at = time.perf_counter()
                telemetry.first_token(tier, first_token_at - start)
            if delta.completion_tokens is None:
                completion_tokens[index] += delta.chunks
            if delta.tool_calls or delta.logprobs:  # rare: the fast path below carries text only
                frame = frames.delta(index, delta.text, delta.reasoning, delta.tool_calls, delta.logprobs)
            else:
                frame = frames.content(index, delta.text, delta.reasoning)
        if delta.finish_reason is not None:
            finished += 1
            frame += frames.finish(index, delta.finish_reason)
        return frame

    # n = 1 (the common case) reads its stream directly: no interleaving generator in between,
    # one async-generator hop fewer per token.
    merged = merge(streams, firsts) if len(streams) > 1 else None
    try:
        yield frames.role(len(streams), cascade_info(decision))
        if merged is None:
            if firsts[0] is not None:
                if frame := frame_for(0, firsts[0]):
                    yield frame
                async for delta in streams[0]:
                    # One send per upstream read, whatever it held.
                    if frame := frame_for(0, delta):
                        yield frame
        else:
            async for index, delta in merged:
                if frame := frame_for(index, delta):
                    yield frame
    except BackendError as exc:
        if isinstance(exc, UsageFault):  # its count is not to be believed: the key pays its reservation
            bill.unknown = True
        telemetry.backend_error(tier, exc)
        yield in_band_error(exc)
        return
    finally:
        # A choice whose engine never reported its prompt (cut before its last chunk) is billed at the bound.
        bill.add(tier.name, sum(p if p > 0 else bill.prompt_bound for p in prompts), sum(completion_tokens),
                 len(streams))
        try:
            if merged is not None:
                await merged.aclose()
        finally:
            await answerer.close(opened)
    total_completion = sum(completion_tokens)
    usage = None
    if seen is not None:
        reasoning = 0
        for index, choice in enumerate(seen):
            reasoning += await shown.tokens(tier, choice.text, choice.reported, choice.chunks, completion_tokens[index])
        usage = usage_with(prompt_tokens, total_completion, cached_tokens, reasoning)
    done = [GenerationResult(text="", retries=retries) for _ in range(finished)]
    yield frames.tail(cascade_info(decision, Answer(results=done), bill.billed(), bill.cost()), usage)
    end = time.perf_counter()
    telemetry.success(decision, end - start, prompt_tokens, total_completion, stream=True)
    if first_token_at is not None:
        telemetry.per_token(tier, first_token_at, end, total_completion / len(streams))


async def deferred(serve: Awaitable[tuple[Decision, Answer]], keepalive_s: float, include_usage: bool,
                   telemetry: Telemetry, bill: Bill, shown: ReasoningShown) -> AsyncGenerator[bytes, None]:
    """`serve`'s answer (a `WholeAnswerer`'s, usually, which bills each tier's answer) as one SSE body, with
    keep-alives while it works, reasoning shown as `shown` says; the caller starts this at once (the service's `chat`
    does), so that `serve` is always awaited or cancelled. The last chunk carries the bill and its cost."""
    start = time.perf_counter()
    task = asyncio.ensure_future(serve)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=keepalive_s)
            if done:
                break
            yield KEEPALIVE
        decision, answer = task.result()
    except CascadeError as exc:
        # Headers are gone: a backend fault, or no branch slots in time (Overloaded), ends the
        # stream with an in-band error rather than a dropped connection.
        if isinstance(exc, Overloaded):
            telemetry.metrics.client_errors.labels("429").inc()
        yield in_band_error(exc)
        return
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    reasoning = await shown.of(decision.tier, answer.results) if include_usage else 0
    telemetry.first_token(decision.tier, time.perf_counter() - start)
    body = whole_answer_frames(decision, answer, include_usage, bill.billed(), bill.cost(), shown.names, reasoning)
    yield body
    results = answer.results
    telemetry.success(decision, time.perf_counter() - start, results[0].prompt_tokens,
                      sum(r.completion_tokens for r in results), answer, stream=True)


# Deltas read ahead per stream while the client is slower than the engines: past it each stream's reader waits, so
# a slow reader holds the engines back (TCP backpressure) instead of the gateway buffering their answers (an n = 4
# stream to a client that read nothing grew a gateway by 160 MB).
MERGE_AHEAD = 4


async def merge(streams: Streams, firsts: list[StreamDelta | None]) -> AsyncGenerator[tuple[int, StreamDelta], None]:
    """Interleave several delta streams as (choice index, delta), in arrival order, reading at most MERGE_AHEAD
    deltas per stream ahead of the consumer."""
    for index, first in enumerate(firsts):
        if first is not None:
            yield index, first
    queue: asyncio.Queue[tuple[int, StreamDelta | BaseException | None]] = asyncio.Queue(MERGE_AHEAD * len(streams))

    async def pump(index: int, stream: AsyncGenerator[StreamDelta, None]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
            await queue.put((index, None))
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put((index, exc))

    pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams) if firsts[i] is not None]
    try:
        remaining = len(pumps)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
