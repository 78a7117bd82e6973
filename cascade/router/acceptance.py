"""Cascade mode: accept a tier's answer, or escalate the request to the next tier.

In cascade mode (`[routing] mode = "cascade"`, or a plan made with `mode = "cascade"`) a request is
answered by the cheapest tier that can accept, and moves up while its answer's **confidence** stays
below that tier's acceptance threshold (Cascadia's rule; the last tier always accepts). An operating
point is one acceptance threshold per tier but the last, named by a quality hint like route mode's.

Confidence of an answer on tier t, in [0, 1]:

* 0 when the answer cannot be right as returned: cut off (`finish_reason` other than `stop`) or empty;
* on a tier with reasoning branches (two or more finished), the share of them that voted for the
  returned answer: self-consistency, evidence read from the answers themselves;
* else, with `[routing.confidence] source` set to a token statistic and an engine that returns token logprobs,
  the answer's own token confidence (DeepConf-style, cascade/branches/confidence.py), mapped through the tier's
  fitted calibration (`calibrated`) when it has one;
* otherwise the router's prior that tier t answers this prompt correctly, ``1 - p_fail[t]`` (learned
  router), or 1 without a learned router or for a prompt it flags as out of its domain (so cascade mode
  then escalates exactly the truncated and empty answers, and backend faults).

A tier whose threshold is above 1 can never accept, so it is skipped rather than run: `best`
(`[NEVER, ...]`) goes straight to the top tier, and a plan can switch tiers off per operating point.
"""

from __future__ import annotations

import math

NEVER = 1.01  # an acceptance threshold no confidence reaches


def default_accept_points(n_tiers: int) -> dict[str, list[float]]:
    """Acceptance thresholds per named hint when neither config nor plan gives them: `fast` accepts
    any answer (even a cut-off one), `balanced` one the router gives even odds or better, `best` only the top tier."""
    k = n_tiers - 1
    return {"fast": [0.0] * k, "balanced": [0.5] * k, "best": [NEVER] * k}


def accept_for_target(target: float, n_tiers: int) -> list[float]:
    """A numeric accuracy target: accept an answer whose confidence reaches the target."""
    return [target] * (n_tiers - 1)


def answer_confidence(prior_correct: float | None, finish_reason: str | None, text: str,
                      agreement: float | None = None, tool_calls: bool = False,
                      token_confidence: float | None = None) -> float:
    """An answer that calls tools (finish_reason `tool_calls`) is complete though it has no text."""
    if finish_reason not in ("stop", "tool_calls") or not (text.strip() or tool_calls):
        return 0.0
    if agreement is not None:  # evidence from the answer itself beats the router's prior
        return agreement
    if token_confidence is not None:
        return min(1.0, max(0.0, token_confidence))
    return 1.0 if prior_correct is None else min(1.0, max(0.0, prior_correct))


def calibrated(raw: float, calibration: tuple[float, float] | None) -> float:
    """A raw token confidence in (0, 1] as a probability of being right: the logistic map fitted on labelled
    outcomes, P = sigmoid(slope * logit(raw) + intercept); `raw` as it is without a calibration."""
    if calibration is None:
        return raw
    slope, intercept = calibration
    c = min(max(raw, 1e-9), 1 - 1e-9)
    z = slope * math.log(c / (1 - c)) + intercept
    return 1 / (1 + math.exp(-z)) if z > -700 else 0.0


def first_tier(accept: list[float]) -> int:
    """The cheapest tier that can accept (the last tier always can)."""
    return next((t for t, h in enumerate(accept) if h <= 1.0), len(accept))


def next_tier(tier: int, accept: list[float]) -> int:
    """The tier to escalate to from `tier`, skipping tiers that can never accept."""
    return next((t for t in range(tier + 1, len(accept)) if accept[t] <= 1.0), len(accept))


def accepts(tier: int, confidence: float, accept: list[float]) -> bool:
    return tier >= len(accept) or (confidence >= accept[tier] and not math.isnan(confidence))
