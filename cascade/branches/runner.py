"""The branch runner: N sampled reasoning branches for one request, early stop at M, two-phase pruning.

SART (../shared/PAPERS.md §2), as implemented here:

* **Launch** N branches as separate streaming requests to the tier's backend: the same messages (so
  SGLang's radix cache shares the prompt prefix), distinct seeds, sampling temperature > 0.
* **Follow** every branch's tokens. A branch is scored every `k` new reasoning steps (paragraphs, split
  on blank lines), never per token, and once more when it finishes.
* **Phase 1** (no branch finished yet): prune a branch whose score is below α, at most β per request,
  and never the last live branch.
* **Phase 2** (from the first finished branch on): α' = that branch's final score; prune every live
  branch scoring below α'.
* **Early stop**: once M branches finished, cancel the rest.
* **First wave** (adaptive consistency, after Aggarwal et al. 2023, "Let's Sample Step by Step"; off unless
  `first_wave` is set): launch only the first `first_wave` branches; when every one of them finished with the
  same answer, that answer stands and the other N - first_wave branches never start. Otherwise they start and
  the request goes on as above. With `wave_margin` set, the waves double instead (W, 2W, 4W, ... N) and the
  request stops after the first wave whose leading answer is `wave_margin` votes ahead of the next. Two sampled
  branches that agree are right about as often as the vote of 8 on GSM8K (Qwen2.5-Coder-1.5B: the same
  accuracy at two thirds of the tokens, docs/measured.md).
* **Confidence pruning** (DeepConf's online rule, cascade/branches/confidence.py; where the engine returns
  token logprobs): a branch whose last `confidence_group` tokens' group confidence falls below
  `prune_confidence` is stopped, no scorer needed; never the last live branch.
* **DeepConf with a learned level** (`confidence_keep`, with a first wave as its warm-up): when the first wave
  does not settle the request, the level is the (1 - keep) quantile of its finished branches' trace confidences
  (each one's weakest group; DeepConf's token confidence from `top_logprobs`, else the sampled token's logprob),
  and a later branch whose running group confidence falls below it is stopped (counted as `pruned_confidence`).
  The vote can keep only the surest `vote_keep` share of the finished branches, and weigh each vote by its
  branch's confidence (`aggregation = "confidence"`).
* Pruned and early-stopped branches are cancelled upstream at once: the stream is closed, which
  closes the HTTP response (the engine stops generating), and the SGLang client also sends
  `/abort_request` for the branch's rid.
* **Failures** end one branch: any error on its stream (an engine's 400 too), or `finish_reason: "abort"`
  (aborted upstream by someone else: cut off, it neither votes nor counts toward M). Only when no branch
  finished does the request fail, with the last branch's error.
* **Aggregate** the finished branches: majority vote over their answers (`cascade.data.grading.answer_key`,
  the grader's own reading of an answer), ties broken by the best score and then by the shorter
  branch (short-m@k's rule); or a score-weighted vote (`aggregation = "weighted"`). If every branch
  was cut off by max_tokens, the vote runs over those.

The runner owns no HTTP server and no framework: it takes a `Backend`, the generation requests (one
per branch) and a `Scorer`, and is tested against the fake engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from cascade import tracing
from cascade.branches.backend import Backend, GenerationRequest, StreamDelta
from cascade.branches.confidence import GroupWindow, TraceConfidence, quantile, token_certainties, token_logprobs
from cascade.branches.sart import Finished, Scored, next_wave, to_prune, vote, wave_settles
from cascade.branches.scoring import STEP_SEPARATOR, Scorer, split_steps
from cascade.config import BranchSettings, check_branches, reads_confidence
from cascade.errors import BackendFailed, CascadeError

__all__ = ["BranchReport", "BranchRun", "BranchRunner", "BranchSettings"]  # BranchSettings: cascade/config/branches.py


@dataclass
class Branch:
    index: int
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tokens: int = 0
    steps_scored: int = 0
    score: float | None = None
    state: str = "running"  # pending | running | finished | pruned | stopped | failed
    finish_reason: str | None = None
    prompt_tokens: int = 0
    scoring: bool = False
    logprobs: list[float] = field(default_factory=list)  # the sampled tokens' (when the engine sends them)
    window: GroupWindow | None = None
    trace: TraceConfidence | None = None  # DeepConf's running confidence (where the settings read it)
    reasoning_tokens: int | None = None  # as the engine reported them (StreamDelta's)
    reasoning_chunks: int = 0

    @property
    def full_text(self) -> str:
        return "".join(self.text)

    @property
    def steps(self) -> list[str]:
        return split_steps("".join(self.reasoning) + STEP_SEPARATOR + self.full_text)


class BranchReport(msgspec.Struct, kw_only=True):
    """What happened to a request's branches (the `cascade.branches` object and the metrics)."""

    launched: int
    finished: int
    pruned_phase1: int
    pruned_phase2: int
    early_stopped: int
    failed: int
    decode_tokens: int  # generated by all branches, pruned and stopped ones included
    scores_computed: int
    answer: str | None  # the voted answer key
    votes: dict[str, int]
    chosen: int  # index of the branch whose text is returned
    pruned_confidence: int = 0  # stopped by their group confidence (prune_confidence)
    waves: int = 1  # waves launched: 2 or more when a first wave (`first_wave`) did not settle the request


class BranchRun(msgspec.Struct, kw_only=True):
    text: str
    reasoning: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int  # of the returned branch
    report: BranchReport
    # Every branch's text so far and how it ended (finished/pruned/stopped/failed), by branch index:
    # for offline analysis (benchmarks, scorer training), never sent to clients.
    branch_texts: list[tuple[str, str]] = msgspec.field(default_factory=list)
    logprobs: list[float] = msgspec.field(default_factory=list)  # the returned branch's token logprobs
    # The returned branch's reasoning tokens as its engine reported them (None: it reported none), and its stream
    # chunks that carried reasoning text.
    reasoning_tokens: int | None = None
    reasoning_chunks: int = 0


class BranchRunner:
    def __init__(self, backend: Backend, settings: BranchSettings, scorer: Scorer | None = None) -> None:
        """`scorer`: scores branches as they go and prunes by the scores (None: no scoring and no pruning by score,
        as a tier with scorer = "none"). Raises BrokenRule (a ValueError) for settings that break a rule."""
        check_branches(settings)
        self.backend = backend
        self.settings = settings
        self.scorer = scorer

    async def run(self, question: str, requests: Sequence[GenerationRequest],
                  on_branch_end: Callable[[], None] | None = None) -> BranchRun:
        """Run len(requests) branches (one request each, e.g. distinct seeds) to an aggregated answer.
        `on_branch_end` is called once per branch when its upstream stream is closed (after it finished,
        was pruned, stopped or failed): the moment its engine slot is free again."""
        # Traced (cascade/tracing/): a span for the run, one per branch under it, each branch's upstream calls in it.
        with tracing.branches(self.backend.name, len(requests), self.settings.m) as spans:
            return await _Run(self, question, list(requests), on_branch_end, spans).go()


class _Run:
    def __init__(self, runner: BranchRunner, question: str, requests: list[GenerationRequest],
                 on_branch_end: Callable[[], None] | None, spans: tracing.BranchSpans) -> None:
        self.on_branch_end = on_branch_end
        self.spans = spans
        self.settings = runner.settings
        self.backend = runner.backend
        self.scorer = runner.scorer
        self.question = question
        self.requests = requests
        # Held back by a first wave: "pending" until launched (never live, never counted).
        first = runner.settings.first_wave or len(requests)
        self.branches = [Branch(index=i, state="running" if i < first else "pending") for i in range(len(requests))]
        self.events: asyncio.Queue[tuple[str, int, object]] = asyncio.Queue()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.score_tasks: set[asyncio.Task[None]] = set()
        self.first_finished_score: float | None = None
        self.pruned = [0, 0]
        self.pruned_confidence = 0
        self.scores_computed = 0
        self.error: Exception | None = None
        self.launched = first  # branches launched so far: a first wave, then (unless it settled) more waves
        self.waves = 1
        self.traced = reads_confidence(runner.settings)
        # DeepConf online: the confidence below which a branch after the first wave is stopped, learned from the
        # first wave's finished branches when the second wave starts (`confidence_keep`).
        self.stop_below: float | None = None

    async def go(self) -> BranchRun:
        try:
            self._launch(range(self.launched))
            while self._live() or self._next_wave():
                kind, index, payload = await self.events.get()
                branch = self.branches[index]
                if kind == "delta":
                    await self._on_delta(branch, payload)  # type: ignore[arg-type]
                elif kind == "end":
                    await self._on_end(branch)
                elif kind == "error":
                    if branch.state == "running":
                        self._leave(branch, "failed")
                        self.error = payload  # type: ignore[assignment]
                elif kind == "score":
                    branch.scoring = False
                    if branch.state == "running":
                        branch.score = payload  # type: ignore[assignment]
                        self._prune()
                if sum(b.state == "finished" for b in self.branches) >= self.settings.m:
                    self._stop_all("stopped")
        finally:
            self._stop_all("stopped")
            pending = [*self.tasks.values(), *self.score_tasks]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return self._aggregate()

    def _launch(self, indices: range) -> None:
        for index in indices:
            self.tasks[index] = asyncio.create_task(self._pump(index, self.requests[index]),
                                                    context=self.spans.context(index))

    def _next_wave(self) -> bool:
        """Called when no branch is live: launch the next wave of the branches held back, unless the branches
        launched so far settle the request (`wave_settles`). True when it launched one."""
        if self.launched == len(self.branches):
            return False
        finished = [self._finished(b) for b in self.branches[:self.launched] if b.state == "finished"]
        if len(finished) >= self.settings.m or wave_settles(self.launched, finished, self.settings.wave_margin):
            return False  # M finished (early stop), or the waves so far settle the request
        first = self.launched
        if self.settings.confidence_keep > 0 and self.stop_below is None:
            warm = [w for b in self.branches[:first] if b.state == "finished" and b.trace is not None
                    and (w := b.trace.lowest_group) is not None]
            if warm:  # the level the surest `confidence_keep` of them reached at their weakest
                self.stop_below = quantile(warm, 1.0 - self.settings.confidence_keep)
        self.launched = next_wave(first, len(self.branches), self.settings.wave_margin)
        self.waves += 1
        for branch in self.branches[first:self.launched]:
            branch.state = "running"
        self._launch(range(first, self.launched))
        return True

    @staticmethod
    def _finished(branch: Branch) -> Finished:
        return Finished(branch.index, branch.full_text, branch.score, branch.tokens, branch.finish_reason == "stop",
                        None if branch.trace is None else branch.trace.weight)

    def _live(self) -> list[Branch]:
        return [b for b in self.branches if b.state == "running"]

    async def _pump(self, index: int, request: GenerationRequest) -> None:
        stream: AsyncGenerator[StreamDelta, None] = self.backend.stream(request)
        try:
            async for delta in stream:
                self.events.put_nowait(("delta", index, delta))
            self.events.put_nowait(("end", index, None))
        except Exception as exc:  # whatever it is, it ends this branch only; `go` must hear of it or it waits forever
            self.events.put_nowait(("error", index, exc))
        finally:
            try:
                # Closing the stream is what cancels the generation upstream (and aborts it on SGLang).
                with contextlib.suppress(Exception):
                    await stream.aclose()
            finally:
                # Only now is the engine's slot free: a slot handed on when the branch merely left the
                # race let a waiting request start while the cancelled stream was still open upstream.
                if self.on_branch_end is not None:
                    self.on_branch_end()

    async def _on_delta(self, branch: Branch, delta: StreamDelta) -> None:
        if branch.state != "running":
            return
        branch.text.append(delta.text)
        branch.reasoning.append(delta.reasoning)
        branch.reasoning_chunks += delta.reasoning_chunks
        if delta.reasoning_tokens is not None:
            branch.reasoning_tokens = delta.reasoning_tokens
        branch.tokens = delta.completion_tokens if delta.completion_tokens is not None else branch.tokens + delta.chunks
        if delta.prompt_tokens is not None:
            branch.prompt_tokens = delta.prompt_tokens
        if delta.finish_reason is not None:
            branch.finish_reason = delta.finish_reason
        if delta.logprobs:
            self._on_logprobs(branch, token_logprobs(delta.logprobs))
            if self.traced and branch.state == "running":
                self._on_certainties(branch, delta.logprobs)
            if branch.state != "running":
                return
        if self.scorer is not None and not branch.scoring:
            steps = len(branch.steps) - 1  # the last paragraph may still be growing
            if steps >= branch.steps_scored + self.settings.k:
                branch.steps_scored = steps
                branch.scoring = True
                task = asyncio.create_task(self._score(branch.index, branch.steps[:steps]))
                self.score_tasks.add(task)
                task.add_done_callback(self.score_tasks.discard)

    def _on_logprobs(self, branch: Branch, values: list[float]) -> None:
        branch.logprobs.extend(values)
        threshold = self.settings.prune_confidence
        if threshold <= 0 or branch.finish_reason is not None:
            return  # a branch whose last delta arrived has finished: it is voted on, not pruned
        if branch.window is None:
            branch.window = GroupWindow(self.settings.confidence_group)
        for value in values:
            branch.window.push(value)
            if branch.window.full and branch.window.confidence < threshold and len(self._live()) > 1:
                self._cancel(branch, "pruned")
                self.pruned_confidence += 1
                return

    def _on_certainties(self, branch: Branch, entries: list[msgspec.Raw]) -> None:
        """DeepConf's reading of the branch's tokens; past the first wave, the learned stop (`confidence_keep`):
        never the last live branch, never one whose last token has come (it is voted on)."""
        if branch.trace is None:
            branch.trace = TraceConfidence(self.settings.confidence_group)
        certainties = token_certainties(entries)
        level = self.stop_below
        if level is None or branch.index < self.settings.first_wave or branch.finish_reason is not None:
            branch.trace.extend(certainties)
            return
        branch.trace.top_k = branch.trace.top_k or certainties.top_k
        for value in certainties.values:
            branch.trace.push(value)
            current = branch.trace.current
            if current is not None and current < level and len(self._live()) > 1:
                self._cancel(branch, "pruned")
                self.pruned_confidence += 1
                return

    async def _score(self, index: int, steps: list[str]) -> None:
        assert self.scorer is not None
        try:
            value = await self.scorer.score(self.question, steps)
        except CascadeError:
            value = None  # a scorer fault never fails the request: the branch just is not pruned
        self.scores_computed += 1
        self.events.put_nowait(("score", index, value))

    async def _on_end(self, branch: Branch) -> None:
        if branch.state != "running":
            return
        if branch.finish_reason == "abort":
            self._leave(branch, "failed")
            rid = self.requests[branch.index].request_id
            self.error = BackendFailed(f"backend `{self.backend.name}` aborted the branch (rid {rid})",
                                       self.backend.name)
            return
        self._leave(branch, "finished")
        branch.finish_reason = branch.finish_reason or "stop"
        if self.scorer is not None:
            try:
                branch.score = await self.scorer.score(self.question, branch.steps)
                self.scores_computed += 1
            except CascadeError:
                branch.score = None
            if self.first_finished_score is None and branch.score is not None:
                self.first_finished_score = branch.score  # alpha' of phase 2
                self._prune()

    def _prune(self) -> None:
        victims = to_prune([Scored(b.index, b.score) for b in self._live()], self.settings.alpha,
                           self.settings.beta, self.pruned[0], self.first_finished_score)
        for index in victims:
            self._cancel(self.branches[index], "pruned")
        self.pruned[0 if self.first_finished_score is None else 1] += len(victims)

    def _leave(self, branch: Branch, state: str) -> None:
        branch.state = state
        self.spans.left(branch.index, state, branch.tokens, branch.score)

    def _cancel(self, branch: Branch, state: str) -> None:
        self._leave(branch, state)
        task = self.tasks.get(branch.index)
        if task is not None and not task.done():
            task.cancel()

    def _stop_all(self, state: str) -> None:
        for branch in self._live():
            self._cancel(branch, state)

    def _aggregate(self) -> BranchRun:
        finished = [b for b in self.branches if b.state == "finished"]
        if not finished:
            if self.error is not None:
                raise self.error
            raise RuntimeError("no branch finished")  # unreachable: the last live branch is never pruned
        result = vote([self._finished(b) for b in finished], weighted=self.settings.aggregation == "weighted",
                      by_confidence=self.settings.aggregation == "confidence", keep=self.settings.vote_keep)
        chosen = self.branches[result.chosen]
        self.spans.voted(result.chosen, len(finished), result.votes, result.answer)
        report = BranchReport(
            launched=self.launched, finished=len(finished), pruned_phase1=self.pruned[0],
            pruned_phase2=self.pruned[1], early_stopped=sum(b.state == "stopped" for b in self.branches),
            failed=sum(b.state == "failed" for b in self.branches),
            decode_tokens=sum(b.tokens for b in self.branches), scores_computed=self.scores_computed,
            answer=result.answer, votes=result.votes, chosen=chosen.index, pruned_confidence=self.pruned_confidence,
            waves=self.waves,
        )
        return BranchRun(text=chosen.full_text, reasoning="".join(chosen.reasoning),
                         finish_reason=chosen.finish_reason or "stop", prompt_tokens=chosen.prompt_tokens,
                         completion_tokens=chosen.tokens, report=report,
                         branch_texts=[(b.full_text, b.state) for b in self.branches[:self.launched]],
                         logprobs=chosen.logprobs, reasoning_tokens=chosen.reasoning_tokens,
                         reasoning_chunks=chosen.reasoning_chunks)
