"""The emulated GPU's scheduler (cascade/testing/fakes/gpu.py serves it): continuous batching as SGLang runs it, each
iteration taking the time a measured profile (cascade/optimizer/profile.py) gives it.

One loop on the event loop, like SGLang's scheduler (sglang/srt/managers/scheduler.py, `event_loop_normal`): an
iteration either prefills the waiting requests it can admit (first come, first served, together up to
`prefill_budget_tokens` prompt tokens: SGLang's chunked_prefill_size) and gives each its first token, or decodes one
token for every running sequence. A prefill takes `prefill.fixed_s + prefill.per_token_s x tokens`; a decode step
`decode.fixed_s + per_sequence_s x B + per_context_token_s x C` (C: the batch's context tokens in total).

The KV cache is `kv_capacity_tokens` slots; a sequence holds its prompt and what it generated. Admission follows
SGLang's PrefillAdder: a request starts only when its prompt plus its expected output (the new-token ratio x what is
left of max_new_tokens, clipped at 4096) fits beside the running sequences' expected outputs; the ratio starts at 0.7
and decays to 0.098 over 600 decode steps (SGLANG_INIT_NEW_TOKEN_RATIO, _MIN_NEW_TOKEN_RATIO_FACTOR, _DECAY_STEPS).
The rest wait in the queue. When a decode step finds no slot for every sequence, sequences are retracted (the ones
with the fewest output tokens, then the longest prompts, as `retract_decode` does) back to the queue, their KV freed;
they prefill prompt + output again when readmitted. `abort` frees a sequence's KV at once.

`time_scale` is wall seconds per emulated second (0.1: ten times faster than the GPU). Steps keep to a timeline
(each ends `scale x step` after the previous one's end, on time.perf_counter: uvloop's loop clock counts whole
milliseconds), so a late wake-up does not add up over steps; a late step is made up by shortening the next ones
to no less than half their time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterable
from typing import Literal

import msgspec

from cascade.optimizer.profile import UNBOUNDED_KV_TOKENS, Profile

INIT_NEW_TOKEN_RATIO, MIN_RATIO_FACTOR, RATIO_DECAY_STEPS = 0.7, 0.14, 600
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
MAX_LAG_S = 0.05  # a timeline further behind than this (a stalled loop) restarts from now instead of racing; `lag_s`
# adds up what was lost that way, so that a benchmark can tell when its CPU could not keep up with the emulated GPU
CATCH_UP = 0.5


class Step(msgspec.Struct, frozen=True):
    """One iteration as it ran: what it did, the profile's time for it and the wall time it took (scale removed)."""

    kind: Literal["prefill", "decode"]
    batch: int
    tokens: int  # prefill: prompt tokens; decode: the batch's context tokens
    gpu_s: float
    wall_s: float


class Sequence:
    """One request on the GPU: `output_tokens` to generate (its answer), `max_new_tokens` (what the request allows,
    which admission reserves for). `generated` grows as the loop runs; `changed` is set at every change."""

    _serial = itertools.count()

    def __init__(self, rid: str, prompt_tokens: int, output_tokens: int, max_new_tokens: int) -> None:
        self.rid = rid
        self.prompt_tokens = max(1, prompt_tokens)
        self.output_tokens = output_tokens
        self.max_new_tokens = max(max_new_tokens, output_tokens)
        self.order = next(self._serial)
        self.generated = 0
        self.state: Literal["waiting", "running", "done", "aborted"] = "waiting"
        self.changed = asyncio.Event()

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.state in ("done", "aborted")

    def expected_new(self, ratio: float) -> int:
        return math.ceil(ratio * max(0, min(self.max_new_tokens, CLIP_MAX_NEW_TOKENS) - self.generated))

    async def progress(self, seen: int) -> int:
        """Tokens generated so far, once more than `seen` are out or the sequence finished."""
        while self.generated <= seen and not self.finished:
            self.changed.clear()
            await self.changed.wait()
        return self.generated


class GpuBatcher:
    def __init__(self, profile: Profile, *, kv_capacity_tokens: int | None = None, time_scale: float = 1.0,
                 prefill_budget_tokens: int = 8192, max_running: int = 0, keep_steps: int = 0,
                 stream_interval: int = 1) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale:g}")
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        self.profile = profile
        self.capacity = kv_capacity_tokens or profile.kv_capacity_tokens or UNBOUNDED_KV_TOKENS
        self.time_scale = time_scale
        self.prefill_budget_tokens = prefill_budget_tokens
        self.max_running = max_running
        self.keep_steps = keep_steps  # how many recent Steps `steps` keeps (0: none)
        # SGLang's --stream-interval: a sequence's waiter wakes at its first token, then every this many tokens and
        # at its end (fewer chunks, same TTFT and end-to-end times)
        self.stream_interval = stream_interval
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.steps: list[Step] = []
        self.ratio = INIT_NEW_TOKEN_RATIO
        self.retracted = 0  # sequences retracted so far
        self.gpu_s = 0.0  # emulated busy time so far
        self.lag_s = 0.0  # emulated time lost to a loop that ran late (a CPU too busy to emulate this GPU faithfully)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._due = 0.0

    @property
    def used_tokens(self) -> int:
        return sum(s.kv_tokens for s in self.running)

    def submit(self, seq: Sequence) -> None:
        """Queue `seq`; ValueError when its prompt alone is more than the whole cache."""
        if seq.prompt_tokens + 1 > self.capacity:
            raise ValueError(f"the prompt ({seq.prompt_tokens} tokens) is longer than the KV cache "
                             f"({self.capacity} tokens)")
        self.waiting.append(seq)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def abort(self, seq: Sequence) -> None:
        """Stop `seq` wherever it is; its KV is free at once."""
        if seq.finished:
            return
        for queue in (self.waiting, self.running):
            if seq in queue:
                queue.remove(seq)
        self._finish(seq, "aborted")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        self._due = time.perf_counter()
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                self._due = time.perf_counter()  # a busy period starts now
                continue
            admitted = self._admit()
            if admitted:
                await self._prefill(admitted)
            elif self.running:
                await self._decode()
            else:  # the head of the queue cannot fit an empty cache (a retracted sequence that outgrew it): fail it
                self.abort(self.waiting[0])

    def _admit(self) -> list[Sequence]:
        free = self.capacity - self.used_tokens - sum(s.expected_new(self.ratio) for s in self.running)
        budget, admitted = self.prefill_budget_tokens, list[Sequence]()
        for seq in self.waiting:
            if self.max_running and len(self.running) + len(admitted) >= self.max_running:
                break
            prefill = seq.kv_tokens  # a retracted sequence prefills its output again too
            need = prefill + seq.expected_new(self.ratio)
            alone = not admitted and not self.running
            if (need > free and not (alone and prefill < self.capacity)) or (admitted and prefill > budget):
                break
            admitted.append(seq)
            free, budget = free - need, budget - prefill
        del self.waiting[:len(admitted)]  # first come, first served: the admitted are the head of the queue
        return admitted

    async def _prefill(self, admitted: list[Sequence]) -> None:
        tokens = sum(s.kv_tokens for s in admitted)
        p = self.profile.prefill
        for seq in admitted:
            seq.state = "running"
        self.running.extend(admitted)
        await self._take("prefill", len(admitted), tokens, p.fixed_s + p.per_token_s * tokens)
        self._advance(s for s in admitted if s.state == "running")

    async def _decode(self) -> None:
        self._retract_for(len(self.running))
        context = self.used_tokens
        d = self.profile.decode
        batch = len(self.running)
        step_s = d.fixed_s + d.per_sequence_s * batch + d.per_context_token_s * context
        await self._take("decode", batch, context, step_s)
        self.ratio = max(self.ratio - self._decay(), INIT_NEW_TOKEN_RATIO * MIN_RATIO_FACTOR)
        self._advance(list(self.running))

    def _retract_for(self, slots: int) -> None:
        """Free `slots` KV slots for a decode step by sending sequences back to the queue (retract_decode)."""
        if self.capacity - self.used_tokens >= slots:
            return
        self.running.sort(key=lambda s: (s.generated, -s.prompt_tokens), reverse=True)
        retracted = []
        # One sequence alone past the cache goes on (SGLang raises out of memory there; admission makes it rare).
        while len(self.running) > 1 and self.capacity - self.used_tokens < len(self.running):
            seq = self.running.pop()
            seq.state = "waiting"
            retracted.append(seq)
        self.retracted += len(retracted)
        self.waiting = sorted(self.waiting + retracted, key=lambda s: s.order)
        everyone = self.running + retracted
        self.ratio = min(1.0, (sum(s.generated for s in everyone) + RETRACT_DECODE_STEPS * len(everyone))
                         / (sum(s.max_new_tokens for s in everyone) + 1))

    def _decay(self) -> float:
        return INIT_NEW_TOKEN_RATIO * (1 - MIN_RATIO_FACTOR) / RATIO_DECAY_STEPS

    def _advance(self, sequences: Iterable[Sequence]) -> None:
        """One token more for each sequence; the ones whose answer is out are done."""
        for seq in sequences:
            seq.generated += 1
            if seq.generated >= seq.output_tokens:
                self.running.remove(seq)
                self._finish(seq, "done")
            elif seq.generated == 1 or seq.generated % self.stream_interval == 0:
                seq.changed.set()

    def _finish(self, seq: Sequence, state: Literal["done", "aborted"]) -> None:
        seq.state = state
        seq.changed.set()
        self._wake.set()

    async def _take(self, kind: Literal["prefill", "decode"], batch: int, tokens: int, gpu_s: float) -> None:
        """Spend `gpu_s` emulated seconds (x time_scale on the wall clock), on the timeline."""
        start = time.perf_counter()  # not the loop's clock: uvloop's counts whole milliseconds
        if start - self._due > MAX_LAG_S:  # the CPU could not keep the GPU's pace: count it, start afresh
            self.lag_s += (start - self._due) / self.time_scale
            self._due = start
        self._due += gpu_s * self.time_scale
        # A late step catches up, but no step takes less than CATCH_UP of its time (no bursts of tokens).
        await asyncio.sleep(max(CATCH_UP * gpu_s * self.time_scale, self._due - time.perf_counter()))
        self.gpu_s += gpu_s
        if self.keep_steps:
            self.steps.append(Step(kind, batch, tokens, gpu_s, (time.perf_counter() - start) / self.time_scale))
            del self.steps[:-self.keep_steps]
