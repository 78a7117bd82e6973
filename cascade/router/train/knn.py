"""Fitting kNN p_fail (cascade/router/knn.py has the model): per tier, k and m chosen by cross-validated log loss on
the training rows only (KFold, seeded); soft labels are scored by their cross-entropy."""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import KFold

from cascade.router import knn
from cascade.router.knn import KS, MAX_K, P_MIN, SMOOTHING, knn_p_fail, neighbours, unit_rows


def cross_entropy(p: np.ndarray, target: np.ndarray) -> float:
    p = np.clip(p, P_MIN, 1 - P_MIN)
    return float(-(target * np.log(p) + (1 - target) * np.log(1 - p)).mean())


class KnnFailure:
    """Fitted by `fit(E, failed)`: ``E`` (n, dims) embeddings, ``failed`` (n, tiers) failure labels in [0, 1];
    `predict_p_fail(E)` -> (m, tiers). Fitted attributes end in ``_`` (scikit-learn's convention)."""

    def __init__(self, *, ks: tuple[int, ...] = KS, smoothing: tuple[float, ...] = SMOOTHING, cv: int = 5,
                 random_state: int = 0) -> None:
        if not ks or min(ks) < 1 or max(ks) > MAX_K:
            raise ValueError(f"k candidates must be 1..{MAX_K}, got {ks}")
        if not smoothing or min(smoothing) < 0:
            raise ValueError(f"smoothing candidates must be >= 0, got {smoothing}")
        if cv < 2:
            raise ValueError(f"cv must be at least 2, got {cv}")
        self.ks, self.smoothing, self.cv, self.random_state = ks, smoothing, cv, random_state

    def fit(self, E: np.ndarray, failed: np.ndarray) -> KnnFailure:
        failed = np.asarray(failed, dtype=float)
        if failed.ndim != 2 or len(failed) != len(E) or not np.all((failed >= 0) & (failed <= 1)):
            raise ValueError(f"failed must be (n, tiers) in [0, 1] with n = {len(E)}, got shape {failed.shape}")
        if len(E) < 2 * self.cv:
            raise ValueError(f"{self.cv}-fold selection needs at least {2 * self.cv} rows, got {len(E)}")
        self.E_ = unit_rows(E)
        self.failed_ = failed
        self.prior_ = failed.mean(axis=0)
        grid = [(k, m) for k in self.ks for m in self.smoothing]
        losses = np.zeros((failed.shape[1], len(grid)))
        for train, test in KFold(self.cv, shuffle=True, random_state=self.random_state).split(self.E_):
            sims, index = neighbours(self.E_[test], self.E_[train], max(self.ks))
            prior = failed[train].mean(axis=0)
            for t in range(failed.shape[1]):
                labels = failed[train, t][index]
                for g, (k, m) in enumerate(grid):
                    p = knn_p_fail(sims, labels, float(prior[t]), k, m)
                    losses[t, g] += cross_entropy(p, failed[test, t]) * len(test)
        best = losses.argmin(axis=1)  # first (smallest k, then smallest m) wins ties
        self.k_ = np.array([grid[g][0] for g in best])
        self.m_ = np.array([grid[g][1] for g in best])
        return self

    def predict_p_fail(self, E: np.ndarray) -> np.ndarray:
        return knn.predict_p_fail(E, self.E_, self.failed_, self.prior_, self.k_, self.m_)
