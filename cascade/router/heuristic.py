"""A first, documented difficulty heuristic, until the learned router (issue 3) replaces it.

Difficulty in [0, 1] grows with what makes a prompt hard for a small model in FACTS.md's
measurements: arithmetic (numbers and operators), multi-step wording, and length. It is a
placeholder policy, not a claim of quality: the learned router is measured against it.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_OPERATOR = re.compile(r"(?<=\d)\s*[-+*/×÷^%]\s*(?=\d)")
_REASONING_WORDS = re.compile(
    r"\b(how many|how much|calculate|compute|solve|prove|total|each|per|percent|ratio|step|why|explain)\b",
    re.IGNORECASE,
)


def heuristic_difficulty(prompt: str) -> float:
    numbers = len(_NUMBER.findall(prompt))
    operators = len(_OPERATOR.findall(prompt))
    cues = len(_REASONING_WORDS.findall(prompt))
    words = max(1, len(prompt.split()))
    # A weighted count squashed to [0, 1): each number, operator or cue word adds evidence.
    score = 0.35 * numbers + 0.5 * operators + 0.3 * cues + 0.25 * math.log1p(words / 20)
    return 1.0 - math.exp(-score / 2.0)
