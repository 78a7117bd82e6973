"""The lexical block of the router's features, and the `restated_number` column: pure-Python counts over a
prompt's text (cascade/router/features.py describes each block). One prompt costs tens of microseconds."""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Within one line: `\s` would span lines, and a run of newlines then costs a rescan from every line start (quadratic).
_OPTION = re.compile(r"^[ \t]*\(?([A-J])[.)][ \t]+(.*)$", re.MULTILINE)
_TOKEN = re.compile(r"[a-z]+")
MAX_NUMBER = 1e15  # numbers above it count as it (no prompt the routers were trained on comes near it)

# Word categories, counted on lower-cased letter tokens with one dict lookup per token (regexes with
# IGNORECASE and alternations cost ~25 us each; this whole block costs a few us per prompt).
_WORDS: dict[str, str] = {
    "number_words": "one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty forty "
                    "fifty sixty hundred thousand million",
    "fraction_words": "half halves quarter quarters third thirds fourth fourths fifth fifths tenth tenths",
    "multiplier_words": "twice double doubled doubles triple tripled triples thrice quadruple",
    "add_words": "total sum altogether combined together additional plus",
    "subtract_words": "left remain remains remaining remained remainder rest minus lost lose loses spent spend spends "
                      "gave give gives away discount off",
    "each_words": "each every per apiece",
    "divide_words": "split share shared shares divide divided equally average ratio evenly",
    "percent_words": "percent percentage percentages",
    "money_words": "dollar dollars cent cents",
    "time_units": "hour hours minute minutes seconds day days week weeks month months year years",
    "distance_units": "mile miles km kilometer kilometers meter meters feet foot inch inches yard yards mph",
    "mass_volume_units": "pound pounds lb lbs ounce ounces oz kg gram grams gallon gallons liter liters cup cups "
                         "pint pints quart quarts",
    "rate_words": "rate speed",
    "conditions": "if until unless instead except only but",
    "sequence_words": "after before then later first second third next last finally",
    "inverse_words": "originally initially",
    "age_words": "old age ages",
    "what_which": "what which",
    "pronouns": "he she they his her their him them",
}
# Two-token phrases: (first tokens, second tokens).
_PHRASES: dict[str, tuple[str, str]] = {
    "how_many": ("how", "many"),
    "how_much": ("how", "much"),
    "comparisons": ("more less fewer older younger longer shorter taller bigger smaller cheaper faster slower", "than"),
    "times_as": ("times", "as more less the"),
    "per_period": ("per an a", "hour day week month year"),
    "at_first": ("at started start what", "first with was"),
    "all_none_of": ("all none both neither", "of"),
}
# Raw-text patterns without IGNORECASE (cheap character-class scans).
_PATTERNS: dict[str, re.Pattern[str]] = {
    "fractions": re.compile(r"\d\s*/\s*\d"),
    "ratios": re.compile(r"\d\s*:\s*\d"),
    "decimals": re.compile(r"\d\.\d"),
    "money_decimals": re.compile(r"\$\d+\.\d"),
    "negated_stem": re.compile(r"\b(?:NOT|EXCEPT|LEAST|FALSE|incorrect)\b"),
    "math_symbols": re.compile(r"[=^√π∫∑<>≤≥±×÷]|\\[a-z]+"),
    "statements": re.compile(r"[Ss]tatement \d"),
    "code": re.compile(r"[{};]"),
}
_CHARS = {"dollar_signs": "$", "percent_signs": "%", "question_marks": "?", "newlines": "\n", "commas": ","}

_WORD_NAMES = tuple(_WORDS)
_PHRASE_NAMES = tuple(_PHRASES)
_WORD_INDEX: dict[str, list[int]] = {}
for _i, _name in enumerate(_WORD_NAMES):
    for _word in _WORDS[_name].split():
        _WORD_INDEX.setdefault(_word, []).append(_i)
_PHRASE_INDEX: dict[tuple[str, str], list[int]] = {}
for _i, _name in enumerate(_PHRASE_NAMES):
    _firsts, _seconds = _PHRASES[_name]
    for _a in _firsts.split():
        for _b in _seconds.split():
            _PHRASE_INDEX.setdefault((_a, _b), []).append(_i)
_PHRASE_FIRST = {a for a, _ in _PHRASE_INDEX}

_SCALARS = (
    "log_chars", "log_words", "log_sentences", "log_numbers", "log_unique_numbers", "number_density",
    "log_max_number", "log_number_span", "log_question_chars", "question_numbers", "log_capitalised",
    "mean_word_length", "sentences_with_numbers", "big_numbers", "round_numbers", "log_options",
    "log_mean_option_chars", "option_length_spread", "stem_share",
)
LEXICAL_NAMES: tuple[str, ...] = (*_SCALARS, *_WORD_NAMES, *_PHRASE_NAMES, *_PATTERNS, *_CHARS)


def lexical_features(prompt: str) -> list[float]:
    """The lexical block for one prompt, in LEXICAL_NAMES order. Counts are log1p-compressed."""
    log1p = math.log1p
    words = prompt.split()
    n_words = max(1, len(words))
    sentences = [s for s in _SENTENCE_END.split(prompt.strip()) if s]
    numbers = _NUMBER.findall(prompt)
    # Capped: a number of 309 digits or more reads as inf, and inf - inf is NaN, which no classifier takes.
    values = [min(float(v), MAX_NUMBER) for v in (n.replace(",", "") for n in numbers)
              if v.replace(".", "", 1).isdigit()]
    question = sentences[-1] if sentences else prompt
    capitalised = {w.strip(".,?!;:'\"()") for w in words[1:] if w[:1].isupper()}
    options = [len(m.group(2)) for m in _OPTION.finditer(prompt)]
    option_total = sum(options)
    option_mean = option_total / len(options) if options else 0.0
    row = [
        log1p(len(prompt)), log1p(len(words)), log1p(len(sentences)), log1p(len(numbers)),
        log1p(len(set(numbers))), len(numbers) / n_words,
        log1p(max(values)) if values else 0.0, log1p(max(values) - min(values)) if values else 0.0,
        log1p(len(question)), float(len(_NUMBER.findall(question))), log1p(len(capitalised)),
        sum(map(len, words)) / n_words,
        sum(1 for s in sentences if _NUMBER.search(s)) / max(1, len(sentences)),
        float(sum(v >= 1000 for v in values)), sum(v % 10 == 0 for v in values if v > 0) / max(1, len(values)),
        log1p(len(options)), log1p(option_mean),
        (math.sqrt(sum((o - option_mean) ** 2 for o in options) / len(options)) / (option_mean + 1.0)
         if options else 0.0),
        1.0 - option_total / max(1, len(prompt)),
    ]
    word_counts = [0] * len(_WORD_NAMES)
    phrase_counts = [0] * len(_PHRASE_NAMES)
    tokens = _TOKEN.findall(prompt.lower())
    for k, token in enumerate(tokens):
        for i in _WORD_INDEX.get(token, ()):
            word_counts[i] += 1
        if token in _PHRASE_FIRST and k + 1 < len(tokens):
            for i in _PHRASE_INDEX.get((token, tokens[k + 1]), ()):
                phrase_counts[i] += 1
    row.extend(log1p(c) for c in word_counts)
    row.extend(log1p(c) for c in phrase_counts)
    row.extend(log1p(len(p.findall(prompt))) for p in _PATTERNS.values())
    row.extend(log1p(prompt.count(ch)) for ch in _CHARS.values())
    return row


_QUESTION_WORD = re.compile(r"\b(?:how|what|which|who|when|where|find|calculate|determine)\b", re.IGNORECASE)
RESTATED_TAIL_WORDS = 4  # "... in 4 weeks?": the number is at most this many words before the end


def restated_number(prompt: str) -> float:
    """1.0 when the question sentence (the last one with a "?", else the last sentence) has a number after
    its question word within its last RESTATED_TAIL_WORDS + 1 words; else 0.0 (see the module docstring).
    The window was chosen by cross-validation on the training half of RouteLLM GSM8K (2, 4, 6 words)."""
    sentences = [s for s in _SENTENCE_END.split(prompt.strip()) if s]
    questions = [s for s in sentences if "?" in s]
    question = questions[-1] if questions else (sentences[-1] if sentences else prompt)
    asked = _QUESTION_WORD.search(question)
    words = (question[asked.end():] if asked else question).split()
    numbered = [i for i, word in enumerate(words) if _NUMBER.search(word)]
    return float(bool(numbered) and len(words) - 1 - numbered[-1] <= RESTATED_TAIL_WORDS)
