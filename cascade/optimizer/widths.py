"""Branch width (N, M) of a reasoning tier, as the planner sees it: what a width returns and what it costs.

A tier with width (N, M) launches N sampled branches for a request, stops once M have finished and
returns their majority answer (SART without pruning, cascade/branches/runner.py). From independent
branches recorded per prompt (`BranchDraws`, in sampling order) the planner derives, per prompt:

* the answer returned: the majority over the M first to finish, ties to the earliest finisher
  (branches of a request advance in lockstep, so the shortest finish first; equal lengths by
  sampling order; the runner breaks ties by its scorer first, then by the shorter branch, as here
  when no scorer runs). Correct when that answer is the reference (answer id 0); its judge score is
  that of the earliest finisher giving it;
* the latency length: the M-th shortest branch (the request ends when it finishes);
* the branch lengths the engine decodes: each of the N branches up to that length (stopped then).

Pruning is left out: it only removes decode tokens, so a width's planned cost is an upper bound,
and the width the planner picks is served with the tier's own pruning settings on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class Width:
    n: int  # branches launched
    m: int  # branches that must finish

    def __post_init__(self) -> None:
        if not 1 <= self.m <= self.n:
            raise ValueError(f"a width needs 1 <= m <= n, got n={self.n}, m={self.m}")

    def __str__(self) -> str:
        return f"({self.n},{self.m})"


SINGLE = Width(1, 1)


@dataclass(frozen=True)
class BranchDraws:
    """Independent branches of one tier, (rows, B) each, in sampling order."""

    answer: np.ndarray  # int: equal ids are equal answers; 0 is the reference answer
    score: np.ndarray  # judge score of each branch's answer in [0, 1]
    tokens: np.ndarray  # each branch's length when run to completion (>= 1)

    @property
    def count(self) -> int:
        return int(self.answer.shape[1])


@dataclass(frozen=True)
class WidthResult:
    """What one width returns per prompt, and what it decodes."""

    width: Width
    correct: np.ndarray  # (rows,) float 0/1
    score: np.ndarray  # (rows,) judge score of the returned answer
    finish_tokens: np.ndarray  # (rows,) length of the M-th finisher: the request's own decode length
    branch_tokens: np.ndarray  # (rows, N) tokens each branch decodes before the request stops

    @property
    def decode_tokens(self) -> np.ndarray:
        return np.asarray(self.branch_tokens.sum(axis=1))


def vote(draws: BranchDraws, width: Width) -> WidthResult:
    """The answer and cost of `width` on every prompt (module docstring)."""
    if width.n > draws.count:
        raise ValueError(f"width {width} needs {width.n} branches per prompt; the outcomes hold {draws.count}")
    answer, score, tokens = (a[:, :width.n] for a in (draws.answer, draws.score, draws.tokens))
    rows = np.arange(len(answer))[:, None]
    order = np.argsort(tokens, axis=1, kind="stable")  # finish order: shortest first, ties by sampling order
    first = order[:, :width.m]
    voters, voter_scores = answer[rows, first], score[rows, first]
    # Votes for each finisher's answer among the M; argmax takes the earliest finisher among tied answers.
    counts = (voters[:, :, None] == voters[:, None, :]).sum(axis=2)
    winner = np.argmax(counts, axis=1)
    picked = np.arange(len(answer))
    chosen = voters[picked, winner]
    finish = tokens[picked, first[:, -1]]
    return WidthResult(width=width, correct=(chosen == 0).astype(float), score=voter_scores[picked, winner],
                       finish_tokens=finish.astype(float), branch_tokens=np.minimum(tokens, finish[:, None]))


def correlated_branches(rng: np.random.Generator, first_correct: np.ndarray, first_score: np.ndarray,
                        first_tokens: np.ndarray, p_correct: np.ndarray, median_tokens: np.ndarray, count: int,
                        correlation: float, max_tokens: int, distractors: int = 4) -> BranchDraws:
    """Synthetic branches of one tier, branch 0 being the tier's single answer as already drawn (so width
    (1, 1) is exactly the single-answer outcome). Each further branch copies branch 0's answer with
    probability `correlation` (errors of one model on one prompt repeat: self-consistency gains less than
    independent draws would), else is drawn afresh: correct with the prompt's p_correct, a wrong answer one
    of `distractors` (Zipf-weighted: wrong answers collide). Marginally every branch is correct with
    p_correct. Scores as the single answer's (correct ~U[0.88, 1], wrong ~U[0.05, 0.6], noise 0.05);
    lengths lognormal (sd 0.5) around the prompt's median, branch 0's as drawn. Assumptions, not measurements."""
    n = len(first_correct)
    weights = 1.0 / np.arange(1, distractors + 1)
    weights /= weights.sum()
    first_answer = np.where(first_correct, 0, 1 + rng.choice(distractors, size=n, p=weights))
    extra = count - 1
    copies = rng.uniform(size=(n, extra)) < correlation
    fresh_correct = rng.uniform(size=(n, extra)) < p_correct[:, None]
    fresh_answer = np.where(fresh_correct, 0, 1 + rng.choice(distractors, size=(n, extra), p=weights))
    answers = np.where(copies, first_answer[:, None], fresh_answer)
    good = rng.uniform(0.88, 1.0, size=(n, extra))
    bad = rng.uniform(0.05, 0.6, size=(n, extra))
    scores = np.clip(np.where(answers == 0, good, bad) + rng.normal(0, 0.05, size=(n, extra)), 0.0, 1.0)
    lengths = np.clip(np.round(rng.lognormal(np.log(median_tokens)[:, None], 0.5, size=(n, extra))), 16, max_tokens)
    return BranchDraws(answer=np.column_stack([first_answer, answers]),
                       score=np.column_stack([first_score, scores]),
                       tokens=np.column_stack([first_tokens, lengths]))
