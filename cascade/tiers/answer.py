"""A tier's answer to one conversation: the one path the gateway, `cascade label` and `cascade bench` take.

`answer`, whole: one branch: each choice is one upstream request, streamed and collected by the tier's replica
pool (which retries a failed answer on another replica). Reasoning branches (SART): per choice, `settings.n`
sampled branches through the branch runner, which stops early, prunes and votes.

`open_answer`, live (the gateway's streamed single-branch answer): the same upstream requests, the same slots,
handed back as open streams with their first deltas read, for the caller to relay and then `aclose`.

Sampling is the same wherever the answer is asked for, so `cascade label` labels exactly what the gateway
serves for the same request: cascade/tiers/upstream.py gives every upstream request its seed and its request id
(distinct and prefix-free, as SGLang needs). Branches run at the request's temperature, or the tier's
`branches.temperature` when it set none (branches must differ).

Slots: every upstream stream holds one of `slots` (the tier's branch slots in the gateway, the benchmark's
own in `cascade bench`) from before it starts until it ends; a branch gives its slot back the moment it
finishes, is pruned or early-stopped, so the freed slot admits a waiting request. A live answer's streams give
theirs back when it is closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from cascade.branches.backend import GenerationRequest, GenerationResult, StreamDelta
from cascade.branches.confidence import TokenConfidence, confidence_of, token_logprobs
from cascade.branches.runner import BranchReport, BranchRun, BranchRunner, BranchSettings
from cascade.branches.slots import BranchSlots
from cascade.schemas import ChatMessage
from cascade.tiers import upstream
from cascade.tiers.build import Tier
from cascade.tiers.upstream import Sampling

_T = TypeVar("_T")
Streams = list[AsyncGenerator[StreamDelta, None]]


class Answer(msgspec.Struct, kw_only=True):
    """A tier's answer: one result per choice and, for reasoning branches, what the branches did."""

    results: list[GenerationResult]
    reports: list[BranchReport] = msgspec.field(default_factory=list)
    branches_configured: int = 1
    # Every branch's text and how it ended, per choice (offline analysis only: never sent to clients).
    runs: list[BranchRun] = msgspec.field(default_factory=list)
    # Per choice, the answer's token confidence as cascade mode reads it (set by the gateway when it asked the
    # engine for token logprobs; None: no logprobs).
    confidence: list[float | None] = msgspec.field(default_factory=list)

    def token_confidence(self, group: int) -> list[TokenConfidence | None]:
        """Per choice, the confidence statistics of the returned answer's tokens (None: the engine sent no
        logprobs): the chosen branch's for reasoning branches."""
        if self.runs:
            return [confidence_of(run.logprobs, group) for run in self.runs]
        return [confidence_of(token_logprobs(r.logprobs or []), group) for r in self.results]

    @property
    def upstream_requests(self) -> int:
        """Requests the engines answered for it: one per choice, or one per launched branch."""
        return sum(r.launched for r in self.reports) if self.reports else len(self.results)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens the engines processed for it: the prompt once per upstream request (each choice, each
        launched branch: the engine counts every one, its prefix cache's share included), as they reported it."""
        if self.reports:
            return (self.results[0].prompt_tokens if self.results else 0) * self.upstream_requests
        return sum(r.prompt_tokens for r in self.results)

    @property
    def decode_tokens(self) -> int:
        """Tokens the tier generated for this answer: all branches', pruned and stopped ones included, and those of
        failed attempts a replica pool retried."""
        retried = sum(r.retried_tokens for r in self.results)
        if self.reports:
            return sum(r.decode_tokens for r in self.reports) + retried
        return sum(r.completion_tokens for r in self.results) + retried


def question_of(messages: list[ChatMessage]) -> str:
    """The text the scorer and the vote read: the last user message (the last message without one)."""
    for message in reversed(messages):
        if message.role == "user":
            return message.text()
    return messages[-1].text()


async def answer(
    tier: Tier, messages: list[ChatMessage], sampling: Sampling, settings: BranchSettings | None = None,
    choices: int = 1, slots: BranchSlots | None = None, slot_wait_s: float | None = None,
    on_admitted: Callable[[], None] | None = None,
) -> Answer:
    """`choices` answers of `tier` to `messages`: one branch each when `settings` is None (or has n = 1),
    else SART branches. Raises BackendError when the tier fails, Overloaded when no slots come in time.
    `on_admitted` is called once the slots are held, just before the first upstream request."""
    template = upstream.template(tier.config, messages, sampling)
    branches = settings.n if settings is not None and settings.n > 1 else 1
    held = _Held(slots, branches * choices)
    await held.acquire(slot_wait_s)
    if on_admitted is not None:
        on_admitted()
    try:
        if branches == 1:
            requests = upstream.choice_requests(template, choices)
            return Answer(results=await _all_or_none(_one(tier, r, held) for r in requests))
        assert settings is not None
        return await _branched(tier, template, question_of(messages), settings, sampling, choices, held)
    finally:
        held.release_rest()


async def _one(tier: Tier, request: GenerationRequest, held: _Held) -> GenerationResult:
    try:
        return await tier.backend.generate(request)
    finally:
        held.release_one()


@dataclass
class Opened:
    """A live single-branch answer: its upstream streams (one per choice) with their first deltas read (None: the
    stream was empty), holding the answer's slots until `aclose`."""

    tier: Tier
    streams: Streams
    firsts: list[StreamDelta | None]
    start: float
    held: _Held

    async def aclose(self) -> None:
        """Close every upstream stream, then give the answer's slots back."""
        try:
            await close_all(self.streams)
        finally:
            self.held.release_rest()


async def open_answer(tier: Tier, messages: list[ChatMessage], sampling: Sampling, choices: int = 1,
                      slots: BranchSlots | None = None, slot_wait_s: float | None = None) -> Opened:
    """`choices` single-branch answers of `tier` as live streams: the requests `answer` would send, one slot per
    stream held as `answer` holds them. Every stream's first delta is read, so a fault before any token raises
    here (every stream closed, the slots given back), and so does Overloaded when no slots come in time."""
    start = time.perf_counter()
    held = _Held(slots, choices)
    await held.acquire(slot_wait_s)
    streams: Streams = []
    firsts: list[StreamDelta | None] = []
    try:
        requests = upstream.choice_requests(upstream.template(tier.config, messages, sampling), choices)
        streams += [tier.backend.stream(r) for r in requests]
        for stream in streams:
            firsts.append(await anext(stream, None))
    except BaseException:
        try:
            await close_all(streams)
        finally:
            held.release_rest()
        raise
    return Opened(tier, streams, firsts, start, held)


async def close_all(streams: Streams) -> None:
    for stream in streams:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def _branched(tier: Tier, template: GenerationRequest, question: str, settings: BranchSettings,
                    sampling: Sampling, choices: int, held: _Held) -> Answer:
    runner = BranchRunner(tier.backend, settings, tier.scorer)
    temperature = sampling.temperature if sampling.temperature is not None else tier.config.branches.temperature
    per_choice = upstream.branch_requests(template, choices, settings.n, temperature)
    runs = await _all_or_none(runner.run(question, requests, held.release_one) for requests in per_choice)
    results = [GenerationResult(text=r.text, reasoning=r.reasoning, finish_reason=r.finish_reason,
                                prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                                reasoning_tokens=r.reasoning_tokens, reasoning_chunks=r.reasoning_chunks) for r in runs]
    return Answer(results=results, reports=[r.report for r in runs], branches_configured=settings.n, runs=runs)


class _Held:
    """The slots one answer holds: taken all at once before any stream starts, given back one per stream
    as it ends, and the rest (streams that never started, e.g. after a cancel) at the end."""

    def __init__(self, slots: BranchSlots | None, count: int) -> None:
        self.slots = slots
        self.count = count
        self.held = 0

    async def acquire(self, wait_s: float | None) -> None:
        if self.slots is not None:
            await self.slots.acquire(self.count, wait_s)
            self.held = self.count

    def release_one(self) -> None:
        if self.slots is not None and self.held:
            self.held -= 1
            self.slots.release(1)

    def release_rest(self) -> None:
        if self.slots is not None and self.held:
            self.slots.release(self.held)
            self.held = 0


async def _all_or_none(work: Iterable[Awaitable[_T]]) -> list[_T]:
    """Await all; on the first failure (or cancellation) cancel the rest and wait for them, so no
    upstream request outlives the one it was made for (asyncio.gather leaves them running)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
