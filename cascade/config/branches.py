"""`[tiers.branches]` of `cascade.toml`: a tier's reasoning branches (SART, cascade/branches/runner.py), and the one
check of their rules.

The Struct is what the branch runner runs with, and its names are those of a request's `branches` override
(`{"n": 8, "m": 2, "alpha": 0.3}`, cascade/schemas.py) and of `cascade bench branches`' flags (`--n`, `--k`,
`--first-wave`), so that nothing translates between them. `check_branches` holds every rule of the settings; loading
the config, a request's override, the bench and the runner all call it, and each names the key its own way
(`tiers[1].branches.m`, `branches.m`, `--m`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from cascade.config.base import Strict

Aggregation = Literal["majority", "weighted", "confidence"]


class BranchSettings(Strict, frozen=True):
    """How a tier runs a request's reasoning branches. Bounds are checked by `check_branches`, not by the types, so
    that a request's override breaking one is told the same rule as a config."""

    n: int = 1  # branches launched per request (N)
    m: int = 1  # branches that must finish (M): the rest are stopped then (early stop)
    # Phase-1 pruning (before any branch finished): prune branches scoring below alpha, at most beta per request
    # (alpha 0: off). Phase 2 (below the first finished branch's score) and scoring are on unless the tier's
    # scorer is "none".
    alpha: float = 0.0
    beta: int = 0
    k: int = 2  # score a branch every k reasoning steps (paragraphs)
    aggregation: Aggregation = "majority"
    # Adaptive consistency: launch this many branches first (0: all at once); when they all finish with one answer,
    # it stands and the other branches never start. 2 or more, below m.
    first_wave: int = 0
    # 0: two waves (the first, then all the rest). More: the waves double (W, 2W, 4W, ... N) and the first one whose
    # leading answer is this many votes ahead of the next settles the request. Needs first_wave.
    wave_margin: int = 0
    # Confidence pruning without a scorer (DeepConf): stop a branch once its last `confidence_group` tokens'
    # confidence, exp(mean token logprob), is below this (0: off). The gateway then asks the engine for token
    # logprobs; an engine that lists `logprobs` in unsupported_params (the embedded one) cannot do it.
    prune_confidence: float = 0.0
    confidence_group: int = 32  # cascade.branches.confidence.DEFAULT_GROUP
    # DeepConf online, with the first wave as its warm-up: when the first wave does not settle the request, the
    # branches launched after it are stopped once their last `confidence_group` tokens' confidence falls below the
    # level that this share of the first wave's finished branches reached at their weakest (0: off; 0.9 keeps the
    # branches at least as sure as the surest 90%, DeepConf-high; 0.1, DeepConf-low). Needs first_wave.
    confidence_keep: float = 0.0
    # DeepConf's filtered vote: only this share of the finished branches votes, the most confident (1: all).
    # `aggregation = "confidence"` weighs each vote by its branch's confidence.
    vote_keep: float = 1.0
    # Candidates per token asked of the engine (`top_logprobs`) for DeepConf's token confidence, the negative mean
    # log-probability of the top k (0 or 1: the sampled token's own log-probability stands in).
    confidence_top_k: int = 0
    # Sampling temperature of branches when the request gives none (identical greedy branches vote alike). On an
    # embedded worker it must equal the worker's `temperature`, which is what the engine samples at.
    temperature: float = 0.7
    # Branch-aware admission: live branches on this tier at most (0: no limit). A request needs one slot per branch;
    # freed slots (finished, pruned, stopped branches) admit waiting requests. At least n (cascade/config/tiers.py:
    # a request's own n is held to the live slots instead, cascade/service/validation.py).
    slots: int = 0


class BrokenRule(ValueError):
    """Settings that break a rule of `check_branches`: `key` names the setting to change (bare: each caller says
    where it is), `rule` what it must be."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"`{key}` {rule}")
        self.key = key
        self.rule = rule


def check_branches(s: BranchSettings, name: Callable[[str], str] = str) -> None:
    """Raise BrokenRule for the first rule `s` breaks: the bounds of each setting and the rules between them. A rule
    names the other settings it involves by `name(key)` (`branches.n` in a request's error, `--n` in the bench's)."""
    n, m, first_wave = name("n"), name("m"), name("first_wave")
    rules = (
        (s.n >= 1, "n", "must be at least 1"),
        (1 <= s.m <= s.n, "m", f"must be between 1 and {n} ({s.n})"),
        (0.0 <= s.alpha <= 1.0, "alpha", "must be in [0, 1]"),
        (s.beta >= 0, "beta", "must be 0 (no phase-1 pruning) or more"),
        (s.k >= 1, "k", "must be at least 1"),
        (not s.first_wave or 2 <= s.first_wave < s.m, "first_wave",
         f"must be 0 (off) or from 2 to {m} - 1 ({s.m - 1}): the first wave stops the request only when its "
         f"branches agree, before {m} of them could finish"),
        (s.wave_margin >= 0, "wave_margin", "must be 0 (two waves) or more"),
        (not s.wave_margin or s.first_wave, "wave_margin",
         f"needs {first_wave}: the margin decides after each wave, and without a first wave every branch starts at "
         "once"),
        (0.0 <= s.prune_confidence <= 1.0, "prune_confidence", "must be in [0, 1]"),
        (s.confidence_group >= 1, "confidence_group", "must be at least 1"),
        (0.0 <= s.confidence_keep <= 1.0, "confidence_keep", "must be in [0, 1]"),
        (not s.confidence_keep or s.first_wave, "confidence_keep",
         f"needs {first_wave}: the stopping level is learned from the first wave's branches"),
        (0.0 < s.vote_keep <= 1.0, "vote_keep", "must be in (0, 1]"),
        (0 <= s.confidence_top_k <= 20, "confidence_top_k", "must be from 0 to 20 (OpenAI's top_logprobs bound)"),
        (0.0 <= s.temperature <= 2.0, "temperature", "must be in [0, 2]"),
        (s.slots >= 0, "slots", "must be 0 (no limit) or more"),
    )
    for ok, key, rule in rules:
        if not ok:
            raise BrokenRule(key, rule)


def reads_confidence(s: BranchSettings) -> bool:
    """Whether these settings read the branches' token logprobs (pruning, the learned stop or the vote)."""
    return s.prune_confidence > 0 or s.confidence_keep > 0 or s.vote_keep < 1.0 or s.aggregation == "confidence"
