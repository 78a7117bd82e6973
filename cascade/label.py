"""`cascade label`: answer every prompt of a dataset on every tier, grade, write outcomes.

The tiers are reached exactly as the gateway reaches them (cascade/tiers/), so outcomes describe
what serving will do. Rows are appended as soon as all tiers answered a prompt, so an interrupted
run resumes where it stopped (ids already in the output are skipped). Each answer is the gateway's
own (cascade/tiers/answer.py) to the prompt sent with `seed`: single-branch tiers decode greedily
(temperature 0) so that a row is reproducible; tiers with reasoning branches sample them seeded at
their branch temperature and run SART, as the gateway serves them. The sample of prompts is drawn
with `seed`.

Row format (one JSON object per line), keyed by dataset row id so that committed outcomes carry no
dataset text (`--with-text` adds prompts for local use):
    {"id": "gsm8k-train:17", "dataset": "gsm8k-train",
     "tiers": {"<tier>": {"correct": bool, "answer": str|null, "output_tokens": int, "latency_s": float,
                          "finish_reason": str, "error": str|null}}}
(the schema, its reader and its writer: cascade.data.outcomes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cascade.branches.confidence import DEFAULT_GROUP
from cascade.branches.slots import BranchSlots
from cascade.data.datasets import DatasetError, load, sample
from cascade.data.grading import extract, grade
from cascade.data.outcomes import OutcomeRow, TierOutcome, read_rows, write_row
from cascade.data.records import Prompt
from cascade.errors import CascadeError, ConfigError
from cascade.schemas import ChatMessage
from cascade.tiers.answer import answer
from cascade.tiers.build import Tier
from cascade.tiers.upstream import label_sampling


def read_done_ids(path: Path) -> set[str]:
    """The ids of the rows already in `path`: those prompts are not labelled again."""
    if not path.is_file():
        return set()
    try:
        rows = read_rows(path)
    except DatasetError as exc:
        raise ConfigError(f"{exc}; move it away") from None
    done = set()
    for line_no, row in rows:
        if row.id is None:
            raise ConfigError(f"{path}:{line_no}: an outcome row without `id`; move it away")
        done.add(row.id)
    return done


def select_prompts(dataset: str, n: int | None, seed: int) -> list[Prompt]:
    try:
        prompts = load(dataset)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    prompts = [p for p in prompts if p.reference]
    if not prompts:
        raise ConfigError(f"dataset {dataset!r} has no prompts with a reference answer to grade against")
    if n is not None and n < len(prompts):
        prompts = sample(prompts, n, np.random.default_rng(seed))
    return prompts


BranchTexts = Callable[[list[dict[str, object]]], None]


async def answer_on_tier(tier: Tier, prompt: Prompt, max_tokens: int | None, seed: int, logprobs: bool = False,
                         on_branches: BranchTexts | None = None) -> TierOutcome:
    """One tier's graded answer: exactly what the gateway serves (cascade/tiers/answer.py) for the prompt sent
    with `seed`, and `temperature: 0` on a single-branch tier so that its row is reproducible (a tier with
    reasoning branches samples them at its branch temperature, seeded, and runs SART as served). `logprobs`: ask
    the engine for token logprobs (where it returns them) and record the answer's token confidence."""
    settings = tier.config.branches
    branched = settings.n > 1
    logprobs = logprobs and tier.returns_logprobs
    sampling = label_sampling(max_tokens, seed, branched, logprobs)
    start = time.perf_counter()
    try:
        whole = await answer(tier, [ChatMessage(role="user", content=prompt.prompt)], sampling,
                             settings if branched else None)
    except CascadeError as exc:
        # A failed answer is an outcome too (the tier did not answer); it is marked so it can be re-run.
        return TierOutcome(correct=False, answer=None, output_tokens=0, latency_s=time.perf_counter() - start,
                           finish_reason="error", error=exc.message)
    result = whole.results[0]
    reference = prompt.reference or ""
    if on_branches is not None and whole.runs:
        on_branches([{"id": prompt.id, "tier": tier.name, "seed": seed, "branch": i, "text": text, "state": state,
                      "correct": grade(text, reference)} for i, (text, state) in enumerate(whole.runs[0].branch_texts)])
    return TierOutcome(
        correct=grade(result.text, reference), answer=extract(result.text, reference),
        output_tokens=result.completion_tokens, latency_s=round(time.perf_counter() - start, 3),
        finish_reason=result.finish_reason, decode_tokens=whole.decode_tokens if whole.reports else None,
        token_confidence=whole.token_confidence(DEFAULT_GROUP)[0] if logprobs else None,
    )


async def label(
    tiers: list[Tier], prompts: list[Prompt], out: Path, concurrency: int, max_tokens: int | None, seed: int,
    with_text: bool = False, on_row: Callable[[OutcomeRow], None] | None = None,
    on_failed: Callable[[OutcomeRow], None] | None = None, logprobs: bool = False,
    on_branches: BranchTexts | None = None,
) -> tuple[int, int]:
    """Label `prompts` not yet in `out`; returns (rows written, prompts that failed on some tier). `on_branches`:
    each branched tier's branch texts per prompt (`--save-branches`), given when its answer is in."""
    done = read_done_ids(out)
    todo = [p for p in prompts if p.id not in done]
    # Weighted: a tier with N reasoning branches holds N of the `concurrency` requests in flight.
    slots = BranchSlots("label", concurrency)

    async def one(tier: Tier, prompt: Prompt) -> TierOutcome:
        weight = min(concurrency, tier.config.branches.n)
        await slots.acquire(weight, timeout_s=None)
        try:
            return await answer_on_tier(tier, prompt, max_tokens, seed, logprobs, on_branches)
        finally:
            slots.release(weight)

    async def row(prompt: Prompt) -> OutcomeRow:
        outcomes = await asyncio.gather(*(one(t, prompt) for t in tiers))
        return OutcomeRow(id=prompt.id, dataset=prompt.id.rsplit(":", 1)[0],
                          tiers={t.name: o for t, o in zip(tiers, outcomes, strict=True)},
                          prompt=prompt.prompt if with_text else None)

    written = failed = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    pending = iter(todo)

    def keep(result: OutcomeRow) -> None:
        nonlocal written, failed
        if any(o.error is not None for o in result.tiers.values()):
            # Not an outcome of the tier but of the run (a timeout under overload, a dead backend):
            # not written, so that the next run retries the prompt.
            failed += 1
            if on_failed:
                on_failed(result)
            return
        write_row(sink, result)
        written += 1
        if on_row:
            on_row(result)

    async def labeller() -> None:
        for prompt in pending:  # one shared iterator: each prompt goes to exactly one labeller
            keep(await row(prompt))

    with out.open("ab") as sink:
        # Few rows in flight, each with all its tiers: rows finish steadily in sample order, and an
        # interruption loses at most these rows' work (all rows at once made every row finish late).
        tasks = [asyncio.create_task(labeller()) for _ in range(rows_in_flight(tiers, concurrency))]
        try:
            await asyncio.gather(*tasks)
        finally:
            # Ctrl-C (or a failing labeller) cancels the in-flight prompts at once; rows written stay.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return written, failed


def rows_in_flight(tiers: list[Tier], concurrency: int) -> int:
    """Prompts labelled at once: enough to fill `concurrency` requests, plus one to cover the gap when a
    row's slowest tier is the only one still running."""
    row_weight = sum(min(concurrency, t.config.branches.n) for t in tiers)
    return max(1, concurrency // max(1, row_weight)) + 1
