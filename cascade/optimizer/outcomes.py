"""Outcomes: one row per profiled prompt with each tier's result, as the planner reads them.

JSONL, one object per line:

    {"id": "gsm8k-17", "input_tokens": 96, "difficulty": 0.31,
     "tiers": {"r1-7b": {"correct": true, "score": 0.92, "output_tokens": 611}, ...}}

`score` is a judge score in [0, 1] (Cascadia's acceptance signal and quality measure); `correct`
is 0/1 correctness; `difficulty` is the router's p_fail of tier 0 (the gateway's routing signal).
`input_tokens` and `output_tokens` may be missing: the planner then draws them from the workload's
length distributions. Rows written by `cascade label` read as they are (their extra fields, such
as `answer` or `finish_reason`, are ignored). Held as numpy columns, tiers in ladder order: a view of
the rows of `cascade.data.outcomes`, the one outcomes schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cascade.data.datasets import DatasetError
from cascade.data.outcomes import OutcomeRow, read_rows
from cascade.errors import ConfigError
from cascade.optimizer.widths import BranchDraws


@dataclass(frozen=True)
class Outcomes:
    tiers: list[str]
    input_tokens: np.ndarray  # (n,), NaN where unknown
    output_tokens: np.ndarray  # (n, tiers), NaN where unknown
    correct: np.ndarray  # (n, tiers), NaN where unknown
    score: np.ndarray  # (n, tiers), NaN where unknown
    difficulty: np.ndarray  # (n,), NaN where unknown
    ids: tuple[str, ...] = ()  # the rows' `id`s, when read from a file
    # Per tier (ladder order), independent reasoning branches per row, where known (synthetic outcomes, or
    # rows whose tier has `branches`).
    branches: tuple[BranchDraws | None, ...] = ()

    @property
    def n(self) -> int:
        return len(self.input_tokens)


def from_rows(rows: list[OutcomeRow], tiers: list[str], source: str = "outcomes") -> Outcomes:
    if not rows:
        raise ConfigError(f"{source}: no rows")
    n, c = len(rows), len(tiers)
    nan = np.full((n, c), np.nan)
    output, correct, score = nan.copy(), nan.copy(), nan.copy()
    inputs, difficulty = np.full(n, np.nan), np.full(n, np.nan)
    for r, row in enumerate(rows):
        missing = [t for t in tiers if t not in row.tiers]
        if missing:
            raise ConfigError(f"{source}: row {r + 1} has no result for tier(s) {', '.join(missing)}")
        if row.input_tokens is not None:
            inputs[r] = row.input_tokens
        elif row.prompt:
            inputs[r] = max(1, len(row.prompt) // 4)  # ~4 characters per token for English text
        if row.difficulty is not None:
            difficulty[r] = row.difficulty
        elif tiers[0] in row.p_fail:
            difficulty[r] = row.p_fail[tiers[0]]  # difficulty is p_fail of tier 0 (DESIGN.md §3)
        for i, tier in enumerate(tiers):
            result = row.tiers[tier]
            if result.output_tokens is not None:
                output[r, i] = result.output_tokens
            if result.correct is not None:
                correct[r, i] = float(result.correct)
            if result.score is not None:
                score[r, i] = result.score
    return Outcomes(tiers=list(tiers), input_tokens=inputs, output_tokens=output, correct=correct,
                    score=score, difficulty=difficulty, ids=tuple(row.id or "" for row in rows),
                    branches=tuple(_branch_draws(rows, tier) for tier in tiers))


def _branch_draws(rows: list[OutcomeRow], tier: str) -> BranchDraws | None:
    """A tier's recorded branches as draws, when every row has some: the first B of each row, B the fewest any
    row has. Answer ids per row: 0 for a correct branch, equal ids for equal wrong answers, a fresh negative id for
    an answer the grader could not read (it agrees with nothing)."""
    recorded = [row.tiers[tier].branches for row in rows]
    if not all(recorded):
        return None
    count = min(len(b) for b in recorded if b)
    answer = np.zeros((len(rows), count), dtype=np.int64)
    score, tokens = np.full((len(rows), count), np.nan), np.zeros((len(rows), count))
    for r, branches in enumerate(recorded):
        assert branches
        ids: dict[str, int] = {}
        for b, branch in enumerate(branches[:count]):
            if branch.correct:
                answer[r, b] = 0
            elif branch.answer is None:
                answer[r, b] = -1 - b  # unreadable: negative (BranchDraws)
            else:
                answer[r, b] = ids.setdefault(branch.answer, len(ids) + 1)
            tokens[r, b] = max(1, branch.output_tokens)
            if branch.score is not None:
                score[r, b] = branch.score
    return BranchDraws(answer=answer, score=score, tokens=tokens)


def load_outcomes(path: str | Path, tiers: list[str]) -> Outcomes:
    try:
        rows = [row for _, row in read_rows(path)]
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    return from_rows(rows, tiers, str(path))
