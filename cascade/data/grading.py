"""The answer grader, shared by `cascade loadgen`, `cascade label`, `cascade bench` and the branch vote (stdlib only).

`grade(response, reference)` decides by the reference's kind:

* a number (GSM8K's ``#### 18``, ``$1,200``, ``2.50``): the response's final number must equal it.
  The final number is, in order of preference: after the last ``####``; in the last ``\\boxed{..}``;
  after the last ``Answer:`` / ``answer is``; else the last number anywhere. Commas, ``$``, ``%`` and
  trailing units are ignored; ``18.00`` equals ``18``; simple fractions are evaluated.
* a single letter A-J (multiple choice): the response's chosen letter must equal it.
* anything else: exact match after normalizing case, whitespace and trailing punctuation, comparing
  the reference with the text after the last ``Answer:`` (or the whole response).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_HASHES_RE = re.compile(r"####\s*(.+)")
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER_RE = re.compile(r"\banswer\b\W{0,3}\s*(?:is\b|:|=)\s*[:=]?(.+)", re.IGNORECASE)
_LETTER_ANSWER_RE = re.compile(
    r"\b(?:answer|option|choice)\b\W{0,3}\s*(?:is\b|:|=)?\s*(?:option\s*)?[(*]*\s*((?-i:[A-J]))\b(?![a-z'])",
    re.IGNORECASE)
_LETTER_ALONE_RE = re.compile(r"^\s*\(?([A-J])\)?(?:[.:)\s]|$)")
_LETTER_ONLY_RE = re.compile(r"\(?[A-Ja-j]\)?\.?")  # fullmatched on stripped text
_LETTER_PAREN_RE = re.compile(r"\(([A-J])\)")
# Edges trimmed before comparing text answers. The trailing run must start where the run does (the lookbehind):
# else a run of punctuation inside the text is rescanned from each of its characters (quadratic).
_LEADING_EDGE = re.compile(r"[\s\"'`*_]+")
_TRAILING_EDGE = re.compile(r"(?<![\s\"'`*_.!?,;:])[\s\"'`*_.!?,;:]+\Z")


def to_number(text: str) -> Decimal | None:
    """A number written as text: ``'$1,200.50'`` -> 1200.50, ``'3/4'`` -> 0.75, ``'12 apples'`` -> 12."""
    match = _NUMBER_RE.search(text)
    if match is None:
        return None
    raw = match.group(0).replace("$", "").replace(",", "").replace(" ", "")
    try:
        if "/" in raw:
            num, den = raw.split("/")
            value = Decimal(num) / Decimal(den)
        else:
            value = Decimal(raw)
    except (InvalidOperation, ZeroDivisionError):
        return None
    return value


def format_number(value: Decimal) -> str:
    """Canonical text for a number: no trailing zeros, no exponent (``18.00`` -> ``18``)."""
    if value == value.to_integral_value():
        return str(value.to_integral_value())
    return format(value.normalize(), "f")


def final_number(text: str) -> Decimal | None:
    """The number a response gives as its answer (see the module docstring for the order)."""
    for pattern in (_HASHES_RE, _BOXED_RE, _ANSWER_RE):
        matches = pattern.findall(text)
        for candidate in reversed(matches):
            value = to_number(candidate)
            if value is not None:
                return value
    numbers = _NUMBER_RE.findall(text)
    for raw in reversed(numbers):
        value = to_number(raw)
        if value is not None:
            return value
    return None


def reference_answer(reference: str) -> str:
    """The answer part of a reference: GSM8K solutions end with ``#### N``; others are the answer."""
    if "####" in reference:
        return reference.rsplit("####", 1)[1].strip()
    return reference.strip()


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter a response picks: ``Answer: C``, ``(C)``, or a reply that is just ``C``."""
    matches = _LETTER_ANSWER_RE.findall(text)
    if matches:
        return matches[-1].upper()
    match = _LETTER_ALONE_RE.match(text)
    if match:
        return match.group(1).upper()
    parens = _LETTER_PAREN_RE.findall(text)
    if parens:
        return parens[-1].upper()
    return None


def _normal_text(text: str) -> str:
    leading = _LEADING_EDGE.match(text)
    body = text[leading.end():] if leading else text
    trailing = _TRAILING_EDGE.search(body)
    return " ".join((body[:trailing.start()] if trailing else body).lower().split())


# Fullmatched on stripped text; `\s*(?:%\s*)?`, not `\s*%?\s*`, so that a run of spaces has one way to match.
_NUMERIC_REFERENCE_RE = re.compile(r"(?:" + _NUMBER + r")\s*(?:%\s*)?[A-Za-z]*\.?")


def reference_kind(answer: str) -> str:
    """`letter` (multiple choice), `number` (optionally with one unit word) or `text`."""
    if len(answer.strip()) == 1 and "A" <= answer.strip().upper() <= "J":
        return "letter"
    if _NUMERIC_REFERENCE_RE.fullmatch(answer.strip()):
        return "number"
    return "text"


def extract(response: str, reference: str) -> str | None:
    """What the grader read as the response's answer, in the reference's kind (for reports)."""
    kind = reference_kind(reference_answer(reference))
    if kind == "letter":
        return choice_letter(response)
    if kind == "number":
        value = final_number(response)
        return None if value is None else format_number(value)
    matches = _ANSWER_RE.findall(response)
    return _normal_text(matches[-1] if matches else response)


def answer_key(response: str) -> str | None:
    """The answer a response gives, without a reference (for majority votes over branches): its final
    number when it has one, else its chosen letter, else the normalized text after its last ``Answer:``
    (or its last line). Two responses vote together exactly when their keys are equal."""
    value = final_number(response)
    if value is not None:
        return format_number(value)
    # Only explicit choices: choice_letter would also read the "I" of "I think" as option I.
    letters = _LETTER_ANSWER_RE.findall(response)
    if letters:
        return str(letters[-1]).upper()
    if _LETTER_ONLY_RE.fullmatch(response.strip()):
        return response.strip(" ().").upper()
    matches = _ANSWER_RE.findall(response)
    lines = [line for line in response.strip().splitlines() if line.strip()]
    text = _normal_text(matches[-1] if matches else (lines[-1] if lines else ""))
    return text or None


def grade(response: str, reference: str) -> bool:
    """True when `response` gives the answer in `reference`."""
    answer = reference_answer(reference)
    kind = reference_kind(answer)
    if kind == "letter":
        return choice_letter(response) == answer.strip().upper()
    if kind == "number":
        expected, got = to_number(answer), final_number(response)
        if expected is None or got is None:
            return False
        return abs(got - expected) <= Decimal("1e-6") * max(Decimal(1), abs(expected))
    matches = _ANSWER_RE.findall(response)
    return _normal_text(matches[-1] if matches else response) == _normal_text(answer)
