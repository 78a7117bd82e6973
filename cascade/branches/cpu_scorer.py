"""An embedded CPU scorer for partial reasoning branches: no GPU, no model, microseconds per call.

It reads what a small model's arithmetic reasoning gets wrong, from the text alone:

* **arithmetic claims**: every ``a op b [op c ...] = r`` in the trace is recomputed (``+ - * / x ×
  ÷``, with ``$``, ``,`` and ``%`` ignored); a wrong claim is strong evidence of a wrong branch, a
  right one weak evidence of a right branch;
* **repetition**: small models that loop repeat whole steps or lines;
* **length**: at the same point of a problem, rambling branches are more often wrong (SART's
  observation that length correlates weakly with correctness; here it is only one feature);
* **the question**: how many of the question's numbers the trace has used, how many large numbers
  it brought in that were neither given nor computed, and how long and number-heavy the question is
  (a PRM sees the question too; for a small model, difficulty decides most outcomes).

Claims written in LaTeX (`\\frac{a}{b}`, `\\times`, `\\[ ... \\]`), the usual style of small instruct
models, are read as plain arithmetic. The score is a logistic function of these features, in [0, 1],
with weights fitted on real branches (see ScorerWeights); `CPUScorer(weights=...)` takes others.
benchmarks/reasoning/branch_scorer.py measures the AUC on held-out GSM8K branches and fits new weights.
"""

from __future__ import annotations

import math
import re

import msgspec

from cascade.branches.scoring import STEP_SEPARATOR

_NUM = r"\$?\d[\d,]*(?:\.\d+)?%?"
_OP = r"[-+*/x×÷]"
# A chain of numbers and operators (atomic), then optionally `= result`; else a number alone. Every chain and every
# number is consumed by one match, so the search never restarts inside one: linear time. (`(NUM(?:OP NUM)+)=NUM`
# rescanned a run of digits, or a long chain without `=`, from each of its positions: quadratic.)
_CLAIM = re.compile(rf"((?>{_NUM}(?:\s*{_OP}\s*{_NUM})+))(?:\s*=\s*({_NUM}))?|{_NUM}")
_TOKEN = re.compile(rf"{_NUM}|{_OP}")


FEATURE_NAMES = ("wrong_claims", "right_claims", "repeated_steps", "repeated_lines", "log_words",
                 "question_coverage", "foreign_numbers", "question_numbers", "log_question_words")


class ScorerWeights(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Logistic weights, one per name in FEATURE_NAMES. Set by hand: signs from each feature's meaning,
    magnitudes guided by a logistic fit on 192 real branches of the former 0.5B embedded reasoning tier on GSM8K
    *train* questions (benchmarks/reasoning/branch_scorer.py prints that fit; its raw coefficients flip signs
    between correlated features, so they are not used as they are). The question features carry
    most of the signal: a 0.5B model's branch correctness is mostly decided by the question. The
    held-out AUC is measured on GSM8K *test* branches (issue note)."""

    bias: float = 0.0
    wrong_claims: float = -0.35  # per wrong claim
    right_claims: float = 0.05  # per right claim, up to 4
    repeated_steps: float = -1.0  # fraction of steps that repeat an earlier step
    repeated_lines: float = -1.0  # fraction of lines that repeat an earlier line
    log_words: float = -0.2  # log(1 + words / 100)
    question_coverage: float = 0.4  # fraction of the question's numbers the trace has used so far
    foreign_numbers: float = -0.4  # fraction of the trace's numbers (> 10) neither given nor computed
    question_numbers: float = -0.15  # numbers given in the question
    log_question_words: float = -1.2  # log(1 + question words / 50)


class Features(msgspec.Struct, frozen=True, kw_only=True):
    wrong_claims: int
    right_claims: int
    repeated_steps: float
    repeated_lines: float
    words: int
    question_coverage: float = 0.0
    foreign_numbers: float = 0.0
    question_numbers: int = 0
    question_words: int = 0

    def vector(self) -> list[float]:
        """In FEATURE_NAMES order: what the weights multiply."""
        return [self.wrong_claims, min(self.right_claims, 4), self.repeated_steps, self.repeated_lines,
                math.log1p(self.words / 100), self.question_coverage, self.foreign_numbers,
                self.question_numbers, math.log1p(self.question_words / 50)]


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


_FRAC = re.compile(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}")
_LATEX_TEXT = re.compile(r"\\text\{[^{}]*\}")
_LATEX_DELIMITERS = re.compile(r"\\[\[\]()]|[{}()]")
_PLAIN_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def plain_arithmetic(text: str) -> str:
    """LaTeX arithmetic as plain text: `\\frac{2100}{300} = 7` -> `2100 / 300 = 7`. Small instruct models
    write their steps in LaTeX; without this most of their claims go unchecked."""
    text = _FRAC.sub(r"\1 / \2", text)
    text = text.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    return _LATEX_DELIMITERS.sub("", _LATEX_TEXT.sub("", text))


def _numbers(text: str) -> set[float]:
    return {float(x.replace(",", "")) for x in _PLAIN_NUMBER.findall(text)}


def _check_claims(plain: str) -> tuple[int, int, set[float]]:
    """(right, wrong, claimed results) of the arithmetic claims in already-plain text."""
    right = wrong = 0
    results: set[float] = set()
    for expression, result in _CLAIM.findall(plain):
        if not result:
            continue  # a number alone, or a chain that claims nothing
        try:
            claimed = _number(result)
        except ValueError:
            continue
        results.add(claimed)
        value = _evaluate(expression)
        if value is None:
            continue
        # Rounded claims (33.33 for 100/3) are right: compare to the claim's own precision.
        decimals = len(result.split(".")[1].rstrip("%")) if "." in result else 0
        tolerance = max(0.5 * 10 ** -decimals, 1e-9 * abs(value))
        if abs(value - claimed) <= tolerance + 1e-9:
            right += 1
        else:
            wrong += 1
    return right, wrong, results


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


def features(steps: list[str], question: str = "") -> Features:
    text = STEP_SEPARATOR.join(steps)
    plain = plain_arithmetic(text)
    right, wrong, computed = _check_claims(plain)
    lines = [line for line in text.splitlines() if len(line.strip()) > 3]
    given, used = _numbers(question), _numbers(plain)
    # Numbers > 10 that the question did not give: computed ones are fine, invented ones are not,
    # and the claim check already vouches for computed ones; small numbers are list markers.
    large = [x for x in used if x > 10]
    return Features(
        wrong_claims=wrong, right_claims=right, repeated_steps=_repeated_fraction(steps),
        repeated_lines=_repeated_fraction(lines), words=len(text.split()),
        question_coverage=len(given & used) / len(given) if given else 0.0,
        foreign_numbers=sum(x not in given and x not in computed for x in large) / len(large) if large else 0.0,
        question_numbers=len(given), question_words=len(question.split()),
    )


def score_features(f: Features, w: ScorerWeights) -> float:
    z = w.bias + sum(getattr(w, name) * x for name, x in zip(FEATURE_NAMES, f.vector(), strict=True))
    return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))


class CPUScorer:
    name = "cpu"

    def __init__(self, weights: ScorerWeights | None = None) -> None:
        self.weights = weights or ScorerWeights()

    def score_steps(self, steps: list[str], question: str = "") -> float:
        return score_features(features(steps, question), self.weights)

    async def score(self, question: str, steps: list[str]) -> float:
        return self.score_steps(steps, question)

    async def aclose(self) -> None:
        return None
