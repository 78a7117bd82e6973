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

A width with a first wave `W` (adaptive consistency, the runner's `first_wave`) launches only the first W
branches; when all W finish with one readable answer, that answer stands and the other N - W never start.
Otherwise the other N - W start when the first wave has finished, and the request ends once M branches in all
have finished (the W of the first wave, then the later ones in the order they finish); the vote is over those M,
a tie still going to the shorter branch (the runner's rule, whichever wave the branch ran in).
Its branch lengths are 0 for a branch never launched, and its request length (`finish_tokens`) is the
first wave's longest branch plus, where a second wave ran, that wave's (M - W)-th finisher: the two waves run
one after the other.

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
    first: int = 0  # adaptive consistency's first wave (0: every branch starts with the request)

    def __post_init__(self) -> None:
        if not 1 <= self.m <= self.n:
            raise ValueError(f"a width needs 1 <= m <= n, got n={self.n}, m={self.m}")
        if self.first and not 2 <= self.first < self.m:
            raise ValueError(f"a first wave needs 2 <= first < m, got first={self.first}, m={self.m}")

    def __str__(self) -> str:
        return f"({self.n},{self.m})" if not self.first else f"({self.n},{self.m},first {self.first})"


SINGLE = Width(1, 1)


@dataclass(frozen=True)
class BranchDraws:
    """Independent branches of one tier, (rows, B) each, in sampling order."""

    answer: np.ndarray  # int: equal ids are equal answers; 0 is the reference answer; < 0 one the grader could not read
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
    if width.first:
        return _adaptive_vote(answer, score, tokens, width)
    picked = np.arange(len(answer))
    order = np.argsort(tokens, axis=1, kind="stable")  # finish order: shortest first, ties by sampling order
    voters = np.zeros(tokens.shape, dtype=bool)
    voters[picked[:, None], order[:, :width.m]] = True
    winner = _majority(answer, tokens, voters)
    finish = tokens[picked, order[:, width.m - 1]]
    return WidthResult(width=width, correct=(answer[picked, winner] == 0).astype(float), score=score[picked, winner],
                       finish_tokens=finish.astype(float), branch_tokens=np.minimum(tokens, finish[:, None]))


def _majority(answer: np.ndarray, tokens: np.ndarray, voters: np.ndarray) -> np.ndarray:
    """Per row, the branch whose answer wins the vote among `voters` (rows, N) bool: the most votes, ties to the
    shortest branch giving a tied answer, then to sampling order (the runner's rule without a scorer)."""
    same = (answer[:, :, None] == answer[:, None, :]) & voters[:, None, :]
    counts = np.where(voters, same.sum(axis=2), -1)
    leading = counts == counts.max(axis=1, keepdims=True)
    return np.argmin(np.where(leading, tokens, np.inf), axis=1)


def _adaptive_vote(answer: np.ndarray, score: np.ndarray, tokens: np.ndarray, width: Width) -> WidthResult:
    """`vote` for a width with a first wave: the first wave settles a prompt whose W answers are one readable
    answer (a negative id is unreadable: it agrees with nothing); elsewhere the other branches start after it and
    the vote is over the first wave and the next M - W of them to finish."""
    w, later_m = width.first, width.m - width.first
    picked = np.arange(len(answer))
    wave = answer[:, :w]
    settled = (wave == wave[:, :1]).all(axis=1) & (wave[:, 0] >= 0)
    first_end = tokens[:, :w].max(axis=1)
    later = tokens[:, w:]
    order = np.argsort(later, axis=1, kind="stable")
    later_end = later[picked, order[:, later_m - 1]]
    voters = np.zeros(tokens.shape, dtype=bool)
    voters[:, :w] = True
    winner_settled = _majority(answer, tokens, voters)
    voters[picked[:, None], w + order[:, :later_m]] = True
    winner = np.where(settled, winner_settled, _majority(answer, tokens, voters))
    branch_tokens = tokens.copy()
    branch_tokens[:, w:] = np.where(settled[:, None], 0, np.minimum(later, later_end[:, None]))
    return WidthResult(width=width, correct=(answer[picked, winner] == 0).astype(float), score=score[picked, winner],
                       finish_tokens=np.where(settled, first_end, first_end + later_end).astype(float),
                       branch_tokens=branch_tokens)


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
