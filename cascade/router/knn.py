"""kNN p_fail over sentence embeddings, the prediction side (`cascade router train --estimator knn`; issue 63
item 2's baseline, arXiv 2505.12601). The fit -- k and m chosen by cross-validated log loss -- is
cascade/router/train/knn.py.

Per tier, the probability that the tier fails a prompt is the distance-weighted mean of its k nearest training
prompts' failure labels (cosine similarity on unit-norm embeddings; weight 1 / (1 - cos + DISTANCE_FLOOR)),
smoothed toward the tier's training failure rate as m pseudo-neighbours of average weight:

    p_fail = (k * weighted_mean + m * prior) / (k + m)

Labels may be soft (a pass rate over sampled answers). A router with this estimator carries its training prompts'
embeddings (float32, 1.5 KB a prompt with MiniLM), not their text.
"""

from __future__ import annotations

import numpy as np

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


def predict_p_fail(E: np.ndarray, reference: np.ndarray, failed: np.ndarray, prior: np.ndarray, k: np.ndarray,
                   m: np.ndarray) -> np.ndarray:
    """p_fail (queries, tiers) of embeddings ``E`` from the fitted ``reference`` (unit rows), their ``failed`` labels
    (rows, tiers), and per tier the training failure ``prior``, ``k`` and ``m``. The queries take the reference's
    dtype (a saved router's is float32): the reference is never copied on the request path."""
    sims, index = neighbours(unit_rows(E).astype(reference.dtype, copy=False), reference, int(np.max(k)))
    return np.stack([knn_p_fail(sims, failed[index, t], float(prior[t]), int(k[t]), float(m[t]))
                     for t in range(failed.shape[1])], axis=1)
