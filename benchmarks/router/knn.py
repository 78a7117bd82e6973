"""kNN p_fail over sentence embeddings: the baseline each new router signal must beat (issue 63 item 2; arXiv
2505.12601 makes it the few-label baseline). Benchmark-only: serving it would mean shipping the training prompts'
embeddings in the router artifact, which this measurement does not justify unless it wins.

Per tier, the probability that the tier fails a prompt is the distance-weighted mean of its k nearest training
prompts' failure labels (cosine similarity on unit-norm embeddings; weight 1 / (1 - cos + DISTANCE_FLOOR)),
smoothed toward the tier's training failure rate as m pseudo-neighbours of average weight:

    p_fail = (k * weighted_mean + m * prior) / (k + m)

k and m are chosen per tier by cross-validated log loss on the training rows only (KFold, seeded); labels may be
soft (a pass rate over sampled answers), the loss is then the cross-entropy against them.
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import KFold

KS = (5, 10, 20, 40, 80)
SMOOTHING = (1.0, 4.0, 16.0, 64.0, 256.0)  # up to ~the prior alone: CV picks how little the neighbours say
# Keeps a near-duplicate from outweighing the rest: at cosine 1 a neighbour counts (0.3 + 0.05) / 0.05 = 7 times a
# typical one at cosine 0.7.
DISTANCE_FLOOR = 0.05
P_MIN = 1e-3  # probabilities are clipped to [P_MIN, 1 - P_MIN] (log loss stays finite)
BLOCK_ROWS = 1024  # query rows per similarity block: 1024 x 14k training rows is ~115 MB of float64
MAX_K = 1000


def unit_rows(E: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm (a zero row stays zero: it is then no nearer to anything than anything else)."""
    E = np.asarray(E, dtype=float)
    norms = np.linalg.norm(E, axis=1, keepdims=True)
    return np.divide(E, norms, out=np.zeros_like(E), where=norms > 0)


def neighbours(queries: np.ndarray, reference: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(similarity, index) of each query row's k most similar reference rows, most similar first, computed in blocks
    of BLOCK_ROWS queries. Ties break by index, so the result is deterministic."""
    k = min(k, len(reference))
    sims = np.empty((len(queries), k))
    index = np.empty((len(queries), k), dtype=int)
    for start in range(0, len(queries), BLOCK_ROWS):
        block = queries[start:start + BLOCK_ROWS] @ reference.T
        order = np.argsort(-block, axis=1, kind="stable")[:, :k]
        index[start:start + len(block)] = order
        sims[start:start + len(block)] = np.take_along_axis(block, order, axis=1)
    return sims, index


def knn_p_fail(sims: np.ndarray, labels: np.ndarray, prior: float, k: int, m: float) -> np.ndarray:
    """p_fail of each query from its neighbours' ``labels`` (queries, >= k), as the module docstring says."""
    k = min(k, sims.shape[1])
    weights = 1.0 / (1.0 - sims[:, :k] + DISTANCE_FLOOR)
    mean = (weights * labels[:, :k]).sum(axis=1) / weights.sum(axis=1)
    return np.clip((k * mean + m * prior) / (k + m), P_MIN, 1 - P_MIN)


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
        sims, index = neighbours(unit_rows(E), self.E_, int(self.k_.max()))
        return np.stack([knn_p_fail(sims, self.failed_[index, t], float(self.prior_[t]), int(self.k_[t]),
                                    float(self.m_[t])) for t in range(self.failed_.shape[1])], axis=1)
