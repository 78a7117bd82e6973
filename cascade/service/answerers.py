"""The gateway's two `TierAnswerer`s (the router's side of the seam, cascade/router/escalation.py): how one request
is answered on one tier as its itinerary walks the tiers. The router's itinerary reaches back into the gateway only
through them.

* `WholeAnswerer`: whole answers (cascade/tiers/answer.py `answer`), whose evidence cascade mode reads;
* `StreamAnswerer`: a live single-branch answer (cascade/tiers/answer.py `open_answer`), relayed as it comes
  (cascade/service/streaming.py); only an itinerary that does not judge answers serves one (a route-mode fallback
  to a tier with branches is answered whole there, and sent as one SSE body).

Both answer inside the tier's admission (its request places and the stream budget, cascade/service/admission.py),
taken and given back through the request's lease (cascade/service/lease.py), with the request's sampling as
cascade/tiers/upstream.py makes it and the tier's branch slots held the same way; both bill what each tier decoded to
the lease, count backend faults and moves (cascade/service/telemetry.py), and go only to tiers the request's API key
may use (`Decision.allowed`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec

from cascade.branches.runner import BranchReport, BranchSettings
from cascade.config import AnswerConfidenceConfig, Limits, reads_confidence
from cascade.errors import BackendError, InvalidRequest
from cascade.router.acceptance import calibrated
from cascade.router.escalation import Evidence, Move
from cascade.schemas import ChatCompletionRequest
from cascade.service.admission import Admission
from cascade.service.decision import Decision
from cascade.service.lease import Lease, TierPlace
from cascade.service.telemetry import Telemetry
from cascade.service.validation import branches_for, check_tier
from cascade.tiers.answer import Answer, Opened, answer, open_answer
from cascade.tiers.build import Tier
from cascade.tiers.upstream import Sampling, sampling_of


@dataclass(frozen=True)
class ServingTiers:
    """What the answerers answer with, one per gateway: the tiers and the gateway's share of them."""

    tiers: list[Tier]
    limits: Limits
    admission: Admission
    telemetry: Telemetry
    confidence: AnswerConfidenceConfig


class _OneRequest:
    """What both answerers share: one request, decided, on the gateway's tiers."""

    def __init__(self, serving: ServingTiers, req: ChatCompletionRequest, decision: Decision, max_tokens: int,
                 lease: Lease) -> None:
        self.serving = serving
        self.req = req
        self.decision = decision
        self.max_tokens = max_tokens
        self.lease = lease
        self.sampling = sampling_of(req, max_tokens, decision.effort)

    def can_take(self, tier: int) -> bool:
        """The request's key may use the tier, a replica is up, and the tier can serve the request as asked (a
        fallback tier is checked only here)."""
        allowed = self.decision.allowed
        if allowed is not None and tier not in allowed:
            return False
        candidate = self.serving.tiers[tier]
        if not candidate.backend.available():
            return False
        try:
            check_tier(self.req, candidate, self.serving.limits)
        except InvalidRequest:
            return False
        return True

    def moved(self, from_tier: int, to_tier: int, why: Move) -> None:
        self.serving.telemetry.moved(self.serving.tiers[from_tier], self.serving.tiers[to_tier], why)

    def settings(self, tier: Tier) -> BranchSettings | None:
        """The request's branch settings on `tier`: checked before serving for every reachable tier, so only a
        route-mode fallback tier (checked by `can_take`) computes them here."""
        if tier.index in self.decision.branches:
            return self.decision.branches[tier.index]
        return branches_for(self.req, tier, self.serving.limits)

    def sampling_on(self, tier: Tier, settings: BranchSettings | None) -> Sampling:
        """The request's sampling on `tier`, with token logprobs the client did not ask for where cascade reads
        them: cascade mode's answer confidence below the top tier (which always accepts), or pruning on it; only
        where the engine returns them (they cost llama.cpp's server 8x its decode time)."""
        if self.req.logprobs or not tier.returns_logprobs:
            return self.sampling
        judges = self.decision.itinerary.judges_answers and self.serving.confidence.source != "prior"
        branches_read = settings is not None and reads_confidence(settings)
        if branches_read or (judges and tier.index < len(self.serving.tiers) - 1):
            top = settings.confidence_top_k if settings is not None and branches_read else 0
            return msgspec.structs.replace(self.sampling, token_logprobs=True, top_logprobs=top)
        return self.sampling


class WholeAnswerer(_OneRequest):
    """Whole answers: all `n` choices of a tier at once, read for their evidence.

    A stream served whole (`deferred`) takes its first tier's admission ahead, before its headers (`hold_first`),
    so that a full tier is a 429 rather than an in-band error in a 200: the first tier's `answer` answers inside
    that place; where no answer takes it (the stream ended or was cancelled first), the lease gives it back."""

    def __init__(self, serving: ServingTiers, req: ChatCompletionRequest, decision: Decision, max_tokens: int,
                 lease: Lease) -> None:
        super().__init__(serving, req, decision, max_tokens, lease)
        self._first: TierPlace | None = None  # the first tier's place, taken ahead of its answer

    async def serve(self) -> tuple[Decision, Answer]:
        served = await self.decision.itinerary.serve(self)
        return self.decision.served(served, self.serving.tiers), served.answer

    async def hold_first(self) -> None:
        """Take the first tier's admission now (its request place, its streams; Overloaded: a 429)."""
        on = self.decision.tier
        self._first = await self.lease.enter(on, self._streams(self.settings(on)))

    def _streams(self, settings: BranchSettings | None) -> int:
        return self.req.n * (settings.n if settings is not None else 1)

    async def answer(self, tier: int) -> Answer:
        on = self.serving.tiers[tier]
        settings = self.settings(on)
        sampling = self.sampling_on(on, settings)
        lease, telemetry = self.lease, self.serving.telemetry
        if tier == self.decision.tier.index and self._first is not None:
            place, self._first = self._first, None  # answered inside the place taken ahead (asked once)
        else:
            place = await lease.enter(on, self._streams(settings))
        # Under way: a whole answer's tokens are known when it ends. Cut before (a cancel), its count is unknown
        # and the lease bills the reservation; failed (a fault, no slots), it is billed nothing.
        lease.answering += 1
        try:
            whole = await answer(on, self.req.messages, sampling, settings, self.req.n, on.slots,
                                 self.serving.limits.max_slot_wait_s)
        except Exception as exc:
            lease.answering -= 1
            lease.failed(exc)
            if isinstance(exc, BackendError):
                telemetry.backend_error(on, exc)
            raise
        finally:
            lease.leave(place)
        lease.answering -= 1
        lease.answered(on, whole.prompt_tokens, whole.decode_tokens, whole.upstream_requests)
        telemetry.branches(on, whole.reports)
        confidence = self.serving.confidence
        if self.decision.itinerary.judges_answers and confidence.source != "prior":
            calibration = confidence.calibration.get(on.name)
            whole.confidence = [None if c is None else calibrated(c.read(confidence.source), calibration)
                                for c in whole.token_confidence(confidence.group_tokens)]
        if sampling.token_logprobs:  # ours (the client did not ask): read above, never passed on
            for result in whole.results:
                result.logprobs = None
        return whole

    def evidence(self, answer: Answer) -> list[Evidence]:
        agreements = [_agreement(r) for r in answer.reports] or [None] * len(answer.results)
        confidence = answer.confidence or [None] * len(answer.results)
        return [Evidence(finish_reason=r.finish_reason, text=r.text, tool_calls=bool(r.tool_calls), agreement=a,
                         token_confidence=c)
                for r, a, c in zip(answer.results, agreements, confidence, strict=True)]


class StreamAnswerer(_OneRequest):
    """A live single-branch answer: a tier's upstream streams, one per choice, their first deltas read. The tier's
    admission and slots stay held until the relay closes them (`close`). A route-mode fallback to a tier with
    branches is answered whole instead (they vote), as a `WholeAnswerer` does, in a task already under way."""

    async def serve(self) -> tuple[Decision, Opened | asyncio.Task[Answer]]:
        served = await self.decision.itinerary.serve(self)
        return self.decision.served(served, self.serving.tiers), served.answer

    async def answer(self, tier: int) -> Opened | asyncio.Task[Answer]:
        on = self.serving.tiers[tier]
        if self.settings(on) is not None:  # only a fallback tier: the first tier's were checked before any answerer
            whole = WholeAnswerer(self.serving, self.req, self.decision, self.max_tokens, self.lease)
            return asyncio.ensure_future(whole.answer(tier))
        place = await self.lease.enter(on, self.req.n)
        try:
            opened = await open_answer(on, self.req.messages, self.sampling_on(on, None), self.req.n, on.slots,
                                       self.serving.limits.max_slot_wait_s)
        except BaseException as exc:
            if isinstance(exc, BackendError):
                self.serving.telemetry.backend_error(on, exc)
            self.lease.failed(exc)
            self.lease.leave(place)
            raise
        self.lease.hold(opened)
        self._live = place
        return opened

    def evidence(self, answer: Opened | asyncio.Task[Answer]) -> list[Evidence]:
        raise TypeError("a live stream is relayed as it comes, never judged: an itinerary that judges answers "
                        "is served whole (WholeAnswerer)")

    _live: TierPlace | None = None  # the live answer's tier place

    async def close(self, opened: Opened) -> None:
        """Close the answer's upstream streams (its slots go back), then leave the tier's place."""
        try:
            await self.lease.close_opened(opened)
        finally:
            if self._live is not None:
                self.lease.leave(self._live)


def _agreement(report: BranchReport) -> float | None:
    """Share of the finished branches that gave the voted answer (None with fewer than two)."""
    if report.finished < 2 or report.answer is None:
        return None
    return report.votes.get(report.answer, 0) / report.finished
