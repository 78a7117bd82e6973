"""What the client gets back: the completion, the `cascade` object, the route decision, in-band errors.

Pure functions of a decision and an answer; the streamed frames of a live answer are cascade/service/streaming.py.
"""

from __future__ import annotations

import itertools
import math
import os
import time

import msgspec

from cascade.branches.backend import GenerationResult
from cascade.errors import CascadeError, Overloaded
from cascade.schemas import (
    REASONING_FIELDS,
    AssistantMessage,
    Billed,
    BranchStats,
    CascadeInfo,
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    CompletionTokensDetails,
    Cost,
    FunctionCallDelta,
    PromptTokensDetails,
    RouteDecision,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from cascade.service.decision import Decision
from cascade.service.frames import DONE, ChunkFrames, sse
from cascade.tiers.answer import Answer
from cascade.tiers.build import Tier

_encode = msgspec.json.Encoder().encode


class _CompletionIds:
    """`chatcmpl-` + 32 hex digits, unique across processes and gateways: 80 random bits per process and a 48-bit
    counter. uuid4 per request read the kernel's random source each time (2% of a loaded gateway's CPU)."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)  # a forked worker must not repeat its parent's ids

    def reseed(self) -> None:
        self._prefix, self._counter = "chatcmpl-" + os.urandom(10).hex(), itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFFFFFFFFFF:012x}"


completion_id = _CompletionIds()


def completion(decision: Decision, answer: Answer, billed: Billed | None = None, cost: Cost | None = None,
               reasoning_names: tuple[str, ...] = REASONING_FIELDS, reasoning_tokens: int = 0) -> ChatCompletion:
    """The completion of `answer`: its reasoning text under each of `reasoning_names`, its `reasoning_tokens` (all
    choices') in its usage (cascade/service/reasoning.py)."""
    results = answer.results
    usage = usage_of(answer, reasoning_tokens)
    return ChatCompletion(
        id=completion_id(), created=int(time.time()), model=decision.tier.name,
        choices=[
            Choice(index=i, finish_reason=r.finish_reason, message=message(r, reasoning_names),
                   logprobs=None if r.logprobs is None else ChoiceLogprobs(content=r.logprobs))
            for i, r in enumerate(results)
        ],
        usage=usage, cascade=cascade_info(decision, answer, billed, cost),
    )


def message(result: GenerationResult, reasoning_names: tuple[str, ...]) -> AssistantMessage:
    """One choice's message: its reasoning under each of `reasoning_names` (null when it has none), no other name."""
    shown = result.reasoning or None
    return AssistantMessage(
        content=None if result.tool_calls and not result.text else result.text, tool_calls=result.tool_calls,
        reasoning_content=shown if "reasoning_content" in reasoning_names else msgspec.UNSET,
        reasoning=shown if "reasoning" in reasoning_names else msgspec.UNSET)


def whole_answer_frames(decision: Decision, answer: Answer, include_usage: bool, billed: Billed | None = None,
                        cost: Cost | None = None, reasoning_names: tuple[str, ...] = REASONING_FIELDS,
                        reasoning_tokens: int = 0) -> bytes:
    """A whole answer as one stream body (cascade mode, reasoning branches: known only at the end); its last chunk
    carries the bill and its cost, and its usage the answer's `reasoning_tokens`."""
    results = answer.results
    frames = ChunkFrames(completion_id(), int(time.time()), decision.tier.name, reasoning_names)
    body = [frames.role(len(results), cascade_info(decision, answer))]
    for i, r in enumerate(results):
        if r.tool_calls or r.logprobs:
            body.append(frames.delta(i, r.text, r.reasoning, call_pieces(r.tool_calls), r.logprobs))
        else:
            body.append(frames.content(i, r.text, r.reasoning))
        body.append(frames.finish(i, r.finish_reason))
    usage = usage_of(answer, reasoning_tokens) if include_usage else None
    body.append(frames.tail(cascade_info(decision, answer, billed, cost), usage))
    return b"".join(body)


def usage_of(answer: Answer, reasoning_tokens: int = 0) -> Usage:
    prompt = answer.results[0].prompt_tokens
    completion_tokens = sum(r.completion_tokens for r in answer.results)
    return usage(prompt, completion_tokens, answer.results[0].cached_tokens, reasoning_tokens)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None, reasoning_tokens: int = 0) -> Usage:
    """OpenAI's usage: `prompt_tokens_details.cached_tokens` only where the engine reported them,
    `completion_tokens_details.reasoning_tokens` always."""
    details = msgspec.UNSET if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details,
                 completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning_tokens))


def cascade_info(decision: Decision, answer: Answer | None = None, billed: Billed | None = None,
                 cost: Cost | None = None) -> CascadeInfo:
    assessment = decision.assessment
    # One branch per choice: a choice aborted upstream (finish_reason "abort") is cut off, not finished.
    aborted = 0 if answer is None else sum(r.finish_reason == "abort" for r in answer.results)
    branches = BranchStats(configured=answer.branches_configured if answer else decision.tier.config.branches.n,
                           launched=0 if answer is None else len(answer.results),
                           finished=0 if answer is None else len(answer.results) - aborted, failed=aborted)
    if answer is not None and answer.reports:
        reports = answer.reports
        branches = BranchStats(
            configured=answer.branches_configured, launched=sum(r.launched for r in reports),
            finished=sum(r.finished for r in reports),
            pruned=sum(r.pruned_phase1 + r.pruned_phase2 + r.pruned_confidence for r in reports),
            early_stopped=sum(r.early_stopped for r in reports),
            pruned_phase1=sum(r.pruned_phase1 for r in reports),
            pruned_phase2=sum(r.pruned_phase2 for r in reports),
            pruned_confidence=sum(r.pruned_confidence for r in reports),
            failed=sum(r.failed for r in reports), decode_tokens=answer.decode_tokens,
            votes=reports[0].votes if len(reports) == 1 else None,
        )
    return CascadeInfo(
        tier=decision.tier.index, tier_name=decision.tier.name, quality=decision.hint,
        difficulty=None if assessment is None else round(assessment.difficulty, 4),
        route_score=None if assessment is None else round(assessment.score, 4), router=decision.router,
        out_of_domain=assessment is not None and assessment.out_of_domain, escalations=decision.escalations,
        confidence=None if decision.confidence is None else round(decision.confidence, 4),
        branches=branches, retries=0 if answer is None else sum(r.retries for r in answer.results),
        fallback_from=decision.fallback_from, note=decision.note, degraded=decision.degraded, billed=billed,
        cost=cost,
    )


def route_decision(decision: Decision, tiers: list[Tier]) -> RouteDecision:
    assessment = decision.assessment
    p_fail = None
    if assessment is not None and assessment.p_fail is not None:
        p_fail = {t.name: round(p, 4) for t, p in zip(tiers, assessment.p_fail, strict=True)}
    thresholds = decision.itinerary.thresholds
    return RouteDecision(
        tier=decision.tier.index, tier_name=decision.tier.name, quality=decision.hint, router=decision.router,
        difficulty=None if assessment is None else round(assessment.difficulty, 4),
        route_score=None if assessment is None else round(assessment.score, 4),
        p_fail=p_fail,
        thresholds=None if thresholds is None else [t if math.isfinite(t) else None for t in thresholds],
        out_of_domain=assessment is not None and assessment.out_of_domain, note=decision.note,
    )


def in_band_error(exc: CascadeError) -> bytes:
    """A fault after the headers went out is reported in-band, as OpenAI does, and ends the stream."""
    kind = "rate_limit_error" if isinstance(exc, Overloaded) else "server_error"
    error = {"error": {"message": exc.message, "type": kind, "param": None, "code": None}}
    return sse(_encode(error)) + DONE


def call_pieces(calls: list[ToolCall] | None) -> list[ToolCallDelta] | None:
    """Whole tool calls as the stream pieces that carry them (one piece per call)."""
    if not calls:
        return None
    return [ToolCallDelta(index=i, id=c.id, type=c.type, function=FunctionCallDelta(name=c.function.name,
                                                                                   arguments=c.function.arguments))
            for i, c in enumerate(calls)]
