"""SART's decisions as pure functions: which live branches to prune now, whether a wave settles the request
(and how many branches the next one launches), and which answer the finished branches vote for.

The branch runner (cascade/branches/runner.py) calls them on live streams, and benchmarks/reasoning/sart_replay.py
on saved branches replayed offline, so that the replay measures the served rule, not a copy of it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from cascade.data.grading import answer_key


class Scored(NamedTuple):
    """A live branch as pruning sees it: its latest score (None: not scored yet)."""

    branch: int  # its index
    score: float | None


class Finished(NamedTuple):
    """A finished branch as the vote sees it."""

    branch: int  # its index
    text: str
    score: float | None
    tokens: int
    complete: bool  # ended on its own (finish `stop`), not cut by max_tokens
    # Its trace confidence (DeepConf: the weakest group of its tokens, cascade/branches/confidence.py), > 0, higher
    # surer; None where the engine sent no logprobs.
    confidence: float | None = None


class Vote(NamedTuple):
    answer: str | None  # the winning answer key (cascade.data.grading.answer_key)
    chosen: int  # index of the branch whose text is returned
    votes: dict[str, int]  # answer key -> branches giving it


def to_prune(live: Sequence[Scored], alpha: float, beta: int, pruned_in_phase1: int,
             first_finished_score: float | None) -> list[int]:
    """Indices of the live branches to prune now (`live` in branch order).

    Phase 1 (no branch finished, `first_finished_score` None): lowest scores first, every branch scoring
    below `alpha`, while fewer than `beta` were pruned in phase 1 and more than one branch stays live;
    `alpha` 0 switches it off. Phase 2: every live branch scoring below the first finished branch's score.
    A branch not scored yet is never pruned."""
    if first_finished_score is None:
        if alpha <= 0:
            return []
        pruned: list[int] = []
        for branch in sorted(live, key=lambda b: 1.0 if b.score is None else b.score):
            if pruned_in_phase1 + len(pruned) >= beta or len(live) - len(pruned) <= 1:
                break
            if branch.score is not None and branch.score < alpha:
                pruned.append(branch.branch)
        return pruned
    return [b.branch for b in live if b.score is not None and b.score < first_finished_score]


def wave_agrees(wave: Sequence[Finished]) -> bool:
    """Whether a first wave (adaptive consistency) settles the request: every branch of it finished on its own
    (none cut by max_tokens, pruned or failed: `wave` holds only finished ones, so a short list cannot agree)
    with one answer."""
    keys = {answer_key(b.text) for b in wave}
    return bool(wave) and all(b.complete for b in wave) and len(keys) == 1 and None not in keys


def wave_settles(launched: int, finished: Sequence[Finished], margin: int) -> bool:
    """Whether the `launched` branches so far settle the request (adaptive consistency), given those of them that
    finished. Margin 0: every one of them finished on its own with one answer (`wave_agrees`). Margin > 0: the
    leading answer (`answer_key`, as the vote reads it) among the branches that ended on their own has at least
    `margin` more votes than the next; with 2 launched and margin 2 that is again "both agree"."""
    if not margin:
        return len(finished) == launched and wave_agrees(finished)
    counts = sorted(Counter(k for b in finished if b.complete and (k := answer_key(b.text)) is not None).values(),
                    reverse=True)
    return bool(counts) and counts[0] - (counts[1] if len(counts) > 1 else 0) >= margin


def next_wave(launched: int, n: int, margin: int) -> int:
    """Branches launched in all once the wave of `launched` did not settle: all N (margin 0, two waves), or twice
    as many, at most N (margin > 0: waves of W, 2W, 4W, ... N)."""
    return min(2 * launched, n) if margin else n


def vote(finished: Sequence[Finished], weighted: bool = False, *, by_confidence: bool = False,
         keep: float = 1.0) -> Vote:
    """Majority vote over the finished branches' answers (those cut by max_tokens only if nothing else
    finished); a branch without an answer never outvotes one with an answer; ties go to the best score,
    then to the shorter branch (short-m@k). `weighted`: votes weigh the branch's score (0.5 unscored).
    DeepConf's vote: `keep` < 1 lets only that share of the voters vote, the most confident (at least one; the
    branches without a confidence stay), and `by_confidence` weighs each vote by its branch's confidence (the
    least confident voter's where one has none)."""
    if not finished:
        raise ValueError("a vote needs at least one finished branch")
    voters = [f for f in finished if f.complete] or list(finished)
    voters = _most_confident(voters, keep)
    floor = min((f.confidence for f in voters if f.confidence is not None), default=1.0)
    groups: dict[str | None, list[Finished]] = defaultdict(list)
    for branch in voters:
        groups[answer_key(branch.text)].append(branch)

    def best_score(members: list[Finished]) -> float:
        return max((b.score for b in members if b.score is not None), default=0.0)

    def weight(members: list[Finished]) -> float:
        if by_confidence:
            return sum(b.confidence if b.confidence is not None else floor for b in members)
        if weighted:
            return sum(b.score if b.score is not None else 0.5 for b in members)
        return float(len(members))

    answer = max(groups, key=lambda k: (k is not None, weight(groups[k]), best_score(groups[k]),
                                        -min(b.tokens for b in groups[k])))
    chosen = max(groups[answer], key=lambda b: (b.score if b.score is not None else 0.0, -b.tokens))
    return Vote(answer=answer, chosen=chosen.branch, votes={str(k): len(v) for k, v in groups.items()})


def _most_confident(voters: list[Finished], keep: float) -> list[Finished]:
    """The share `keep` of `voters` with the highest confidence (rounded up, at least one; equal confidences in
    branch order); those without a confidence are all kept (nothing to rank them by)."""
    rated = [(f.confidence, f.branch) for f in voters if f.confidence is not None]
    if keep >= 1.0 or not rated:
        return voters
    kept = max(1, math.ceil(keep * len(rated) - 1e-9))
    chosen = {branch for _, branch in sorted(rated, key=lambda cb: (-cb[0], cb[1]))[:kept]}
    return [f for f in voters if f.confidence is None or f.branch in chosen]
