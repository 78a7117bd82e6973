"""An embedded CPU scorer for partial reasoning branches: no GPU, no model, microseconds per call.

It reads what a small model's arithmetic reasoning gets wrong, from the text alone:

* **arithmetic claims**: every ``a op b [op c ...] = r`` in the trace is recomputed (``+ - * / x ×
  ÷``, with ``$``, ``,`` and ``%`` ignored); a wrong claim is strong evidence of a wrong branch, a
  right one weak evidence of a right branch;
* **repetition**: small models that loop repeat whole steps or lines;
* **length**: at the same point of a problem, rambling branches are more often wrong (SART's
  observation that length correlates weakly with correctness; here it is only one feature).

The score is a logistic function of these features, in [0, 1]. The default weights were set by hand
from the features' meaning; `CPUScorer(weights=...)` takes weights fitted on labelled branches
(benchmarks/branch_scorer.py measures the AUC of both on held-out GSM8K branches).
"""

from __future__ import annotations

import math
import re

import msgspec

from cascade.branches.scoring import STEP_SEPARATOR

_NUM = r"\$?\d[\d,]*(?:\.\d+)?%?"
_OP = r"[-+*/x×÷]"
_CLAIM = re.compile(rf"({_NUM}(?:\s*{_OP}\s*{_NUM})+)\s*=\s*({_NUM})")
_TOKEN = re.compile(rf"{_NUM}|{_OP}")


class ScorerWeights(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    bias: float = 0.5
    wrong_claims: float = -1.6  # per wrong claim
    right_claims: float = 0.25  # per right claim, up to 4
    repeated_steps: float = -3.0  # fraction of steps that repeat an earlier step
    repeated_lines: float = -2.0  # fraction of lines that repeat an earlier line
    log_words: float = -0.35  # log(1 + words / 100)


class Features(msgspec.Struct, frozen=True, kw_only=True):
    wrong_claims: int
    right_claims: int
    repeated_steps: float
    repeated_lines: float
    words: int


def _number(text: str) -> float:
    return float(text.replace("$", "").replace(",", "").replace("%", ""))


def _evaluate(expression: str) -> float | None:
    """Left-to-right with * and / before + and -; None if it is not a plain arithmetic chain."""
    tokens = _TOKEN.findall(expression)
    try:
        values = [_number(tokens[0])]
        ops: list[str] = []
        for op, raw in zip(tokens[1::2], tokens[2::2], strict=True):
            value = _number(raw)
            if op in "*x×":
                values[-1] *= value
            elif op in "/÷":
                if value == 0:
                    return None
                values[-1] /= value
            else:
                ops.append(op)
                values.append(value)
    except (ValueError, IndexError):
        return None
    total = values[0]
    for op, value in zip(ops, values[1:], strict=True):
        total = total + value if op == "+" else total - value
    return total


def claims(text: str) -> tuple[int, int]:
    """(right, wrong) arithmetic claims in `text`."""
    right = wrong = 0
    for expression, result in _CLAIM.findall(text):
        value = _evaluate(expression)
        if value is None:
            continue
        try:
            claimed = _number(result)
        except ValueError:
            continue
        # Rounded claims (33.33 for 100/3) are right: compare to the claim's own precision.
        decimals = len(result.split(".")[1].rstrip("%")) if "." in result else 0
        tolerance = max(0.5 * 10 ** -decimals, 1e-9 * abs(value))
        if abs(value - claimed) <= tolerance + 1e-9:
            right += 1
        else:
            wrong += 1
    return right, wrong


def _repeated_fraction(items: list[str]) -> float:
    if len(items) < 2:
        return 0.0
    seen: set[str] = set()
    repeats = 0
    for item in items:
        key = " ".join(item.lower().split())
        repeats += key in seen
        seen.add(key)
    return repeats / len(items)


def features(steps: list[str]) -> Features:
    text = STEP_SEPARATOR.join(steps)
    right, wrong = claims(text)
    lines = [line for line in text.splitlines() if len(line.strip()) > 3]
    return Features(wrong_claims=wrong, right_claims=right, repeated_steps=_repeated_fraction(steps),
                    repeated_lines=_repeated_fraction(lines), words=len(text.split()))


def score_features(f: Features, w: ScorerWeights) -> float:
    z = (w.bias + w.wrong_claims * f.wrong_claims + w.right_claims * min(f.right_claims, 4)
         + w.repeated_steps * f.repeated_steps + w.repeated_lines * f.repeated_lines
         + w.log_words * math.log1p(f.words / 100))
    return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))


class CPUScorer:
    name = "cpu"

    def __init__(self, weights: ScorerWeights | None = None) -> None:
        self.weights = weights or ScorerWeights()

    def score_steps(self, steps: list[str]) -> float:
        return score_features(features(steps), self.weights)

    async def score(self, question: str, steps: list[str]) -> float:
        return self.score_steps(steps)

    async def aclose(self) -> None:
        return None
