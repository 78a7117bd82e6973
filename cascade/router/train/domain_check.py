"""Fitting the domain check (cascade/router/domain.py documents the three tests and what chose them): each test's
threshold is the ``quantile`` of held-out training prompts' scores against a model of the other folds (5-fold
cross-fitting), so about 1 - quantile of unseen in-domain prompts are flagged by construction. Training only:
a fitted router carries the ranges, the plane and the word model, and serving only scores against them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.model_selection import KFold

from cascade.router.domain import DEFAULT_QUANTILE, WordModel, excess, residual

FOLDS = 5
# A floor on the range test's threshold (two standard deviations in total): templated training prompts have a
# held-out excess of 0, and a threshold of 0 would flag every prompt that differs from them by a word.
MIN_THRESHOLD = 2.0
# 4/16/32 axes flag 0.6/0.8/1.7% of unseen RouteLLM GSM8K prompts and 98% of ShareGPT alike. With both tests
# (benchmarks/router/domain.py --embeddings) the committed routers' settings flag 0.8-1.1% of unseen GSM8K, all
# MMLU and chat prompts, and 98.7-99.0% of ShareGPT (lexical test alone: 50-64%).
EMBEDDING_AXES = 4


class DomainRange:
    """Per-column training range and the flag threshold of the summed excess."""

    def __init__(self, low: np.ndarray, high: np.ndarray, threshold: float) -> None:
        self.low = low
        self.high = high
        self.threshold = threshold


def _check_quantile(quantile: float) -> None:
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"domain quantile must be in (0, 1), got {quantile}")


def fit_domain(Z: np.ndarray, quantile: float = DEFAULT_QUANTILE, seed: int = 0) -> DomainRange | None:
    """Fit the range test on standardised training features ``Z`` (n_prompts, n_columns). None when there is
    too little data to hold any out (fewer than 2 rows per fold) or no columns."""
    _check_quantile(quantile)
    Z = np.asarray(Z, dtype=float)
    if Z.ndim != 2 or Z.shape[1] == 0 or len(Z) < 2 * FOLDS:
        return None
    held_out = np.empty(len(Z))
    for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(Z):
        held_out[test] = excess(Z[test], Z[train].min(axis=0), Z[train].max(axis=0))
    threshold = max(MIN_THRESHOLD, float(np.quantile(held_out, quantile)))
    return DomainRange(Z.min(axis=0), Z.max(axis=0), threshold)


class EmbeddingPlane:
    """Mean and principal axes of the training prompts' embeddings, and the residual threshold."""

    def __init__(self, mean: np.ndarray, axes: np.ndarray, threshold: float) -> None:
        self.mean = mean
        self.axes = axes
        self.threshold = threshold


def fit_embedding_plane(E: np.ndarray, quantile: float = DEFAULT_QUANTILE, seed: int = 0,
                        n_axes: int = EMBEDDING_AXES) -> EmbeddingPlane | None:
    """Fit the embedding test on the training prompts' embeddings ``E`` (n_prompts, dims); None with too
    few rows (the axes need more rows per fold than there are axes)."""
    _check_quantile(quantile)
    E = np.asarray(E, dtype=float)
    if E.ndim != 2 or len(E) < FOLDS * (n_axes + 2):
        return None
    held_out = np.empty(len(E))
    for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(E):
        mean, axes = _plane(E[train], n_axes)
        held_out[test] = residual(E[test], mean, axes)
    mean, axes = _plane(E, n_axes)
    return EmbeddingPlane(mean, axes, float(np.quantile(held_out, quantile)))


def _plane(E: np.ndarray, n_axes: int) -> tuple[np.ndarray, np.ndarray]:
    mean = E.mean(axis=0)
    _, _, vt = np.linalg.svd(E - mean, full_matrices=False)
    return mean, vt[:n_axes]


def fit_word_model(prompts: Sequence[str], quantile: float = DEFAULT_QUANTILE, seed: int = 0) -> WordModel | None:
    """The word test on the training prompts; its threshold is the ``quantile`` of held-out prompts' surprise
    (5-fold cross-fitting). None with fewer than 2 prompts per fold."""
    _check_quantile(quantile)
    prompts = list(prompts)
    if len(prompts) < 2 * FOLDS:
        return None
    held_out = np.empty(len(prompts))
    for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(prompts):
        held_out[test] = WordModel([prompts[i] for i in train]).surprise([prompts[i] for i in test])
    return WordModel(prompts, float(np.quantile(held_out, quantile)))
