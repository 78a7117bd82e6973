"""Seeded synthetic outcomes for planning without labelled data (tests, benchmarks, examples).

"gsm8k-like": a latent difficulty z ~ Beta(2, 4) per prompt; tier i answers correctly with
probability sigmoid(8 (skill_i - z)); a judge scores correct answers in ~[0.88, 1] and wrong ones in
~[0.05, 0.6] (plus noise), the way Cascadia's GPT-4o judge separates them; the router's
difficulty estimate is z plus noise (an imperfect router). Prompt lengths follow GSM8K's test set
(median 222 characters ~ 55 tokens, plus ~20 tokens of chat template; log-sd 0.39). Reasoning
lengths are lognormal around a per-tier median (DeepSeek-R1 distills write several hundred
thinking tokens on GSM8K; smaller models write more) and grow with difficulty. Reasoning branches,
when asked for, repeat a tier's answer with probability `correlation` and are otherwise fresh draws
(cascade/optimizer/widths.py). These are assumptions for a plausible workload, not measurements.
"""

from __future__ import annotations

import numpy as np

from cascade.optimizer.outcomes import Outcomes
from cascade.optimizer.widths import BranchDraws, correlated_branches

# Default per-position parameters for up to five tiers (cheapest first).
SKILLS = (0.62, 0.78, 0.9, 0.96, 1.0)
OUTPUT_MEDIANS = (800.0, 650.0, 550.0, 500.0, 450.0)


def gsm8k_like(tiers: list[str], n: int = 1000, seed: int = 0, skills: list[float] | None = None,
               output_medians: list[float] | None = None, max_output_tokens: int = 16384,
               branches: int = 1, correlation: float = 0.5) -> Outcomes:
    """`branches` > 1: also that many reasoning branches per prompt and tier (widths.correlated_branches),
    drawn after everything else, so the single-answer outcomes are the same with or without them."""
    rng = np.random.default_rng(seed)
    c = len(tiers)
    skill = np.asarray(skills if skills is not None else SKILLS[:c] if c <= len(SKILLS) else np.linspace(0.6, 1, c))
    medians = np.asarray(output_medians if output_medians is not None else OUTPUT_MEDIANS[:c])
    if len(skill) != c or len(medians) != c:
        raise ValueError("skills and output_medians need one value per tier")
    z = rng.beta(2.0, 4.0, size=n)
    p_correct = 1.0 / (1.0 + np.exp(-8.0 * (skill[None, :] - z[:, None])))
    correct = rng.uniform(size=(n, c)) < p_correct
    good = rng.uniform(0.88, 1.0, size=(n, c))
    bad = rng.uniform(0.05, 0.6, size=(n, c))
    score = np.clip(np.where(correct, good, bad) + rng.normal(0, 0.05, size=(n, c)), 0.0, 1.0)
    inputs = np.maximum(8, np.round(rng.lognormal(np.log(75.0), 0.39, size=n)))
    median = medians[None, :] * (1.0 + 1.5 * z[:, None])
    outputs = np.clip(np.round(rng.lognormal(np.log(median), 0.5)), 16, max_output_tokens)
    difficulty = np.clip(z + rng.normal(0, 0.08, size=n), 0.0, 1.0)
    draws: tuple[BranchDraws | None, ...] = ()
    if branches > 1:
        draws = tuple(correlated_branches(rng, correct[:, i], score[:, i], outputs[:, i], p_correct[:, i],
                                          median[:, i], branches, correlation, max_output_tokens)
                      for i in range(c))
    return Outcomes(tiers=list(tiers), input_tokens=inputs, output_tokens=outputs.astype(float),
                    correct=correct.astype(float), score=score, difficulty=difficulty, branches=draws)
