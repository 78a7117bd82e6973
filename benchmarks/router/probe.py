"""A logistic probe per tier on a feature matrix with several candidate views (e.g. a model's hidden states from
different layers, mean-pooled or at the last token): the representation and the L2 strength C are chosen per tier
by cross-validated log loss on the training rows only, then the probe is refitted on all of them.

As the text router does (cascade/router/train/estimator.py): columns standardised with the training rows' mean and
scale, an L2 logistic regression for "tier t fails", Platt calibration on the out-of-fold decision values of the
chosen (view, C), a tier with fewer than `MIN_MINORITY` rows of its rarer outcome a smoothed constant.

Soft labels (issue 63 item 2, arXiv 2505.12601): where a tier has several sampled answers per question, its
failure *rate* over them can be the training target (``soft``, NaN where a row has only its one outcome): each row
enters the logistic fit twice, as "failed" with weight rate and "passed" with weight 1 - rate. The selection loss
and the Platt calibration stay on the outcome the router is scored on (``failed``), so hard and soft probes are
chosen and calibrated alike and differ only in what the logistic fit learns from.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

CS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
MIN_MINORITY = 10  # fewer failures (or passes) than this in training: the tier gets its smoothed rate
P_MIN = 1e-3  # probabilities are clipped to [P_MIN, 1 - P_MIN]: a steep Platt slope cannot claim certainty
Z_LIMIT = 8.0  # standardised values are clipped to +-Z_LIMIT (an unseen prompt's outlier cannot dominate)
MAX_VIEWS = 64


class ProbeFailure:
    """``views``: name -> column indices of X. `fit(X, failed, soft=None)` then `predict_p_fail(X)` -> (n, tiers).
    Fitted: ``view_`` and ``C_`` per tier (None / NaN for a constant tier), ``coef_``, ``intercept_``,
    ``platt_``."""

    def __init__(self, views: dict[str, np.ndarray], *, Cs: tuple[float, ...] = CS, cv: int = 5,
                 random_state: int = 0) -> None:
        if not 1 <= len(views) <= MAX_VIEWS or any(len(columns) == 0 for columns in views.values()):
            raise ValueError(f"a probe needs 1 to {MAX_VIEWS} non-empty views, got {len(views)}")
        if not Cs or min(Cs) <= 0:
            raise ValueError(f"C candidates must be positive, got {Cs}")
        if cv < 2:
            raise ValueError(f"cv must be at least 2, got {cv}")
        self.views = {name: np.asarray(columns, dtype=int) for name, columns in views.items()}
        self.Cs, self.cv, self.random_state = Cs, cv, random_state

    def fit(self, X: np.ndarray, failed: np.ndarray, soft: np.ndarray | None = None) -> ProbeFailure:
        from threadpoolctl import threadpool_limits

        # Small dense problems: BLAS threads only contend (cascade/router/train/estimator.py measured 6x slower).
        with threadpool_limits(limits=1, user_api="blas"):
            return self._fit(X, failed, soft)

    def _fit(self, X: np.ndarray, failed: np.ndarray, soft: np.ndarray | None) -> ProbeFailure:
        X = np.asarray(X, dtype=float)
        failed = np.asarray(failed, dtype=bool)
        if failed.ndim != 2 or len(failed) != len(X):
            raise ValueError(f"failed must be (n, tiers) with n = {len(X)}, got {failed.shape}")
        soft = np.full(failed.shape, np.nan) if soft is None else np.asarray(soft, dtype=float)
        if soft.shape != failed.shape or np.any((soft < 0) | (soft > 1)):
            raise ValueError(f"soft must be {failed.shape} rates in [0, 1] (NaN: none), got shape {soft.shape}")
        self.mean_ = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scale_ = np.where(scale > 1e-9 * np.maximum(1.0, np.abs(X).max(axis=0)), scale, 1.0)
        Z = self._standardize(X)
        n_tiers = failed.shape[1]
        self.view_: list[str | None] = [None] * n_tiers
        self.C_ = np.full(n_tiers, np.nan)
        self.coef_: list[np.ndarray | None] = [None] * n_tiers
        self.intercept_ = np.zeros(n_tiers)
        self.platt_ = np.tile([1.0, 0.0], (n_tiers, 1))
        for t in range(n_tiers):
            y = failed[:, t]
            if min(y.sum(), (~y).sum()) < max(MIN_MINORITY, self.cv):
                rate = (y.sum() + 1) / (len(y) + 2)
                self.intercept_[t] = np.log(rate / (1 - rate))
                continue
            target = np.where(np.isnan(soft[:, t]), y.astype(float), soft[:, t])
            folds = list(StratifiedKFold(self.cv, shuffle=True, random_state=self.random_state).split(Z, y))
            best = (np.inf, "", 0.0, np.zeros(0))
            for name, columns in self.views.items():
                for C in self.Cs:
                    decision = np.zeros(len(y))
                    for train, test in folds:
                        decision[test] = fit_logistic(Z[np.ix_(train, columns)], target[train], C).decision_function(
                            Z[np.ix_(test, columns)])
                    loss = _log_loss(_platt(decision, y).predict_proba(decision[:, None])[:, 1], y)
                    if loss < best[0]:  # the first (view order, then smallest C) wins ties
                        best = (loss, name, C, decision)
            _, name, C, decision = best
            model = fit_logistic(Z[:, self.views[name]], target, C)
            platt = _platt(decision, y)
            self.view_[t], self.C_[t] = name, C
            self.coef_[t], self.intercept_[t] = model.coef_[0], model.intercept_[0]
            self.platt_[t] = [platt.coef_[0, 0], platt.intercept_[0]]
        return self

    def predict_p_fail(self, X: np.ndarray) -> np.ndarray:
        Z = self._standardize(np.asarray(X, dtype=float))
        logits = np.tile(self.intercept_, (len(Z), 1))
        for t, (name, coef) in enumerate(zip(self.view_, self.coef_, strict=True)):
            if name is not None and coef is not None:
                logits[:, t] = self.platt_[t, 0] * (Z[:, self.views[name]] @ coef + self.intercept_[t]) \
                    + self.platt_[t, 1]
        with np.errstate(over="ignore"):  # exp overflow is a probability of 0, clipped below
            return np.clip(1.0 / (1.0 + np.exp(-logits)), P_MIN, 1 - P_MIN)

    def _standardize(self, X: np.ndarray) -> np.ndarray:
        return np.clip((X - self.mean_) / self.scale_, -Z_LIMIT, Z_LIMIT)


def fit_logistic(Z: np.ndarray, target: np.ndarray, C: float) -> LogisticRegression:
    """L2 logistic regression on targets in [0, 1]: a fractional target is two weighted rows."""
    fractional = (target > 0) & (target < 1)
    if not fractional.any():
        return LogisticRegression(C=C, max_iter=2000).fit(Z, target > 0.5)
    rows = np.r_[np.arange(len(Z)), np.flatnonzero(fractional)]
    labels = np.r_[target >= 0.5, ~(target[fractional] >= 0.5)]
    weights = np.r_[np.where(fractional, np.maximum(target, 1 - target), 1.0), np.minimum(target, 1 - target)[
        fractional]]
    return LogisticRegression(C=C, max_iter=2000).fit(Z[rows], labels, sample_weight=weights)


def _platt(decision: np.ndarray, y: np.ndarray) -> LogisticRegression:
    return LogisticRegression(C=1e6, max_iter=1000).fit(decision[:, None], y)


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-(y * np.log(p) + (~y) * np.log(1 - p)).mean())
