"""Fitting the difficulty classifier (cascade/router/classifier.py documents the model): per-tier C selection by
cross-validated log loss (or APGR), Platt calibration on out-of-fold decision values, the linear estimator, the
domain check's fit, and `cross_validated_p_fail` (out-of-fold p_fail for metrics and operating points).
`fit_classifier` and `fit_classifier_features` are how a `DifficultyClassifier` (prediction only) is fitted: they set
the fitted attributes (ending in ``_``) on the model and return it, as an sklearn ``fit`` would."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from cascade.router.classifier import ESTIMATORS, SELECTIONS, DifficultyClassifier
from cascade.router.embeddings import TOPIC_EMBEDDINGS, embed
from cascade.router.train.aux_models import training_featurizer
from cascade.router.train.domain_check import fit_domain, fit_embedding_plane, fit_word_model


def fit_classifier(model: DifficultyClassifier, prompts: Sequence[str], correct: np.ndarray,
                   groups: Sequence[str] | None = None, X: np.ndarray | None = None) -> DifficultyClassifier:
    """Fit ``model`` on prompts and their outcomes ``correct`` (n_prompts, n_tiers; tiers cheapest first): the
    auxiliary models, one calibrated model per tier and the domain check. Returns ``model``. ``groups`` (e.g.
    subjects), when there are at least ``model.cv`` of them, make the internal folds grouped, so C is chosen for
    unseen groups. ``X``: the prompts' features if already computed by ``training_featurizer(model).transform``."""
    # The auxiliary models are refitted from steps_data (cached per process and file content).
    model.__dict__.pop("steps_model_", None)
    model.__dict__.pop("topic_model_", None)
    featurizer = training_featurizer(model)
    fit_classifier_features(model, featurizer.transform(list(prompts)) if X is None else X, correct, groups)
    checked = model.domain_quantile > 0
    model.domain_words_ = (fit_word_model(prompts, model.domain_quantile, model.random_state)
                          if checked and model.domain_words else None)
    plane = None
    if checked and model.domain_embeddings:
        plane = fit_embedding_plane(embed(TOPIC_EMBEDDINGS, list(prompts)), model.domain_quantile,
                                    model.random_state)
    model.domain_plane_mean_ = None if plane is None else plane.mean
    model.domain_plane_axes_ = None if plane is None else plane.axes
    model.domain_residual_threshold_ = None if plane is None else plane.threshold
    return model


def fit_classifier_features(model: DifficultyClassifier, X: np.ndarray, correct: np.ndarray,
                            groups: Sequence[str] | None = None) -> DifficultyClassifier:
    """`fit_classifier` on features already computed by ``training_featurizer(model).transform`` (e.g. embeddings
    computed once for many cross-validation folds), without the domain check's word and embedding models. The
    auxiliary models the model lacks are fitted from ``steps_data`` (cached per process: the ones that made X's
    steps and topic columns if it came from a model with the same ``steps_data``)."""
    from threadpoolctl import threadpool_limits

    # Small dense problems: BLAS threads only contend (measured 6x slower with 2 threads on 2 cores).
    with threadpool_limits(limits=1, user_api="blas"):
        return _fit(model, np.asarray(X, dtype=float), correct, groups)


def _fit(model: DifficultyClassifier, X: np.ndarray, correct: np.ndarray,
         groups: Sequence[str] | None) -> DifficultyClassifier:
    if model.selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {model.selection!r}")
    if model.estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {model.estimator!r}")
    correct = np.asarray(correct, dtype=bool)
    featurizer = training_featurizer(model)
    if correct.ndim != 2 or correct.shape[0] != len(X) or correct.shape[1] < 1:
        raise ValueError(f"correct must be (n_prompts, n_tiers) = ({len(X)}, T), got {correct.shape}")
    if X.shape[1] != len(featurizer.names):
        raise ValueError(f"X has {X.shape[1]} columns; the feature spec makes {len(featurizer.names)}")
    mask = featurizer.standardize_mask
    model.mean_ = np.where(mask, X.mean(axis=0), 0.0)
    scale = X.std(axis=0)
    # A feature constant in training has a std of float noise (~1e-17): dividing by it would blow an
    # unseen prompt's value up to 1e11+. Such features get scale 1 (and so ~zero weight).
    varies = scale > 1e-9 * np.maximum(1.0, np.abs(X).max(axis=0))
    model.scale_ = np.where(mask & varies, scale, 1.0)
    Z = model.standardize(X)
    failed = ~correct
    n_tiers = correct.shape[1]
    model.coef_ = np.zeros((n_tiers, Z.shape[1]))
    model.intercept_ = np.zeros(n_tiers)
    model.calibration_ = np.tile([1.0, 0.0], (n_tiers, 1))
    model.C_ = np.full(n_tiers, np.nan)
    model.n_tiers_ = n_tiers
    model.n_features_in_ = Z.shape[1]
    model.feature_names_ = featurizer.names
    _fit_domain(model, Z[:, mask])
    if model.estimator == "linear":
        return _fit_linear(model, Z, failed)
    if model.estimator == "knn":
        return _fit_knn(model, X, failed)
    folds = _folds(model, failed, groups)
    learnable = [t for t in range(n_tiers) if folds and _both_classes(failed[:, t], folds)]
    for t in set(range(n_tiers)) - set(learnable):  # (almost) one class: a smoothed constant
        rate = (failed[:, t].sum() + 1) / (len(failed) + 2)
        model.intercept_[t] = np.log(rate / (1 - rate))
    candidates = [model.C] if model.C is not None else list(model.Cs)
    oof = {C: {t: _oof_decision(Z, failed[:, t], C, folds) for t in learnable} for C in candidates}
    for t in learnable:
        if model.selection != "apgr" or len(learnable) < 2:
            model.C_[t] = _select_C(candidates, [_losses(_platt(oof[C][t], failed[:, t]), failed[:, t])
                                                for C in candidates], one_se=model.selection == "log_loss_1se")
    if model.selection == "apgr" and len(learnable) >= 2:
        from cascade.router.evaluate import apgr, routing_curve

        def score(C: float) -> float:
            p_fail = np.tile(1.0 / (1.0 + np.exp(-model.intercept_)), (len(Z), 1))
            for t in learnable:
                p_fail[:, t] = _platt(oof[C][t], failed[:, t])
            return apgr(routing_curve(p_fail, correct))

        best = max(candidates, key=score)  # first (smallest) C wins ties
        model.C_[learnable] = best
    for t in learnable:
        logistic = LogisticRegression(C=float(model.C_[t]), max_iter=5000).fit(Z, failed[:, t])
        platt = _platt_model(oof[float(model.C_[t])][t], failed[:, t])
        model.coef_[t] = logistic.coef_[0]
        model.intercept_[t] = logistic.intercept_[0]
        model.calibration_[t] = [platt.coef_[0, 0], platt.intercept_[0]]
    return model


def _fit_domain(model: DifficultyClassifier, Z_dense: np.ndarray) -> None:
    # The out-of-domain check (cascade/router/domain.py) on the dense standardised columns; 0 turns it off.
    fit = fit_domain(Z_dense, model.domain_quantile, model.random_state) if model.domain_quantile > 0 else None
    model.domain_low_ = None if fit is None else fit.low
    model.domain_high_ = None if fit is None else fit.high
    model.domain_threshold_ = None if fit is None else fit.threshold


def _fit_linear(model: DifficultyClassifier, Z: np.ndarray, failed: np.ndarray) -> DifficultyClassifier:
    for t in range(failed.shape[1]):
        if 0 < failed[:, t].sum() < len(failed):
            ridge = Ridge(alpha=model.alpha).fit(Z, failed[:, t].astype(float))
            model.coef_[t], model.intercept_[t] = ridge.coef_, ridge.intercept_
        else:  # one class: a smoothed constant
            model.intercept_[t] = (failed[:, t].sum() + 1) / (len(failed) + 2)
    return model


def _fit_knn(model: DifficultyClassifier, X: np.ndarray, failed: np.ndarray) -> DifficultyClassifier:
    from cascade.router.train.knn import KnnFailure

    if not model.embeddings or model.spec.dense_columns or model.hash_features:
        raise ValueError("estimator knn reads the prompt's embedding alone: features must be the minilm block only")
    fitted = KnnFailure(cv=model.cv, random_state=model.random_state).fit(X, failed)
    # float32: half the artifact, and cosines to 1e-7 do not reorder neighbours that matter.
    model.knn_reference_ = fitted.E_.astype(np.float32)
    model.knn_failed_ = fitted.failed_
    model.knn_prior_ = fitted.prior_
    model.knn_k_ = fitted.k_
    model.knn_m_ = fitted.m_
    return model


def _folds(model: DifficultyClassifier, failed: np.ndarray,
           groups: Sequence[str] | None) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import GroupKFold

    if groups is not None and len(set(groups)) >= model.cv:
        return list(GroupKFold(model.cv).split(failed, groups=list(groups)))
    # Stratify on the cheapest tier that both fails and succeeds (a weak tier may never succeed:
    # stratifying on it would leave no folds, and so no learned tier at all).
    minority = _minority_counts(failed)
    t = _first_tier_with(minority, 2)
    if t is None:
        return []
    splitter = StratifiedKFold(min(model.cv, int(minority[t])), shuffle=True, random_state=model.random_state)
    return list(splitter.split(failed, failed[:, t]))


def _minority_counts(outcomes: np.ndarray) -> np.ndarray:
    """Per tier, how often the rarer of its two outcomes (right / wrong) occurs."""
    return np.minimum(outcomes.sum(axis=0), (~outcomes).sum(axis=0))


def _first_tier_with(minority: np.ndarray, at_least: int) -> int | None:
    """The cheapest tier whose rarer outcome occurs at least `at_least` times: the tier to stratify folds on."""
    enough = np.flatnonzero(minority >= at_least)
    return int(enough[0]) if enough.size else None


def _both_classes(y: np.ndarray, folds: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    return all(0 < y[train].sum() < len(train) for train, _ in folds)


def _oof_decision(Z: np.ndarray, y: np.ndarray, C: float, folds: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    return cross_val_predict(LogisticRegression(C=C, max_iter=5000), Z, y, cv=folds, method="decision_function")


def _platt_model(decision: np.ndarray, y: np.ndarray) -> LogisticRegression:
    return LogisticRegression(C=1e6, max_iter=1000).fit(decision[:, None], y)


def _platt(decision: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _platt_model(decision, y).predict_proba(decision[:, None])[:, 1]


def _losses(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(y * np.log(p) + (~y) * np.log(1 - p))


def _select_C(candidates: list[float], losses: list[np.ndarray], one_se: bool) -> float:
    """The C with the lowest mean out-of-fold log loss or, with ``one_se``, the smallest C (strongest
    shrinkage) whose mean loss is within one standard error of the best (glmnet's lambda.1se rule)."""
    means = np.array([loss.mean() for loss in losses])
    best = int(np.argmin(means))
    if not one_se:
        return candidates[best]
    bound = means[best] + losses[best].std() / np.sqrt(len(losses[best]))
    return min(C for C, m in zip(candidates, means, strict=True) if m <= bound)


def cross_validated_p_fail(model: DifficultyClassifier, prompts: Sequence[str], correct: np.ndarray,
                           groups: Sequence[str] | None = None, folds: int = 5, seed: int = 0,
                           X: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold p_fail for every prompt. With at least `folds` distinct groups (e.g. MMLU subjects) the
    folds are grouped (no group in both train and test); otherwise stratified on the failures of the cheapest
    tier that fails and succeeds at least `folds` times each (a weak tier that is almost never right, like
    SmolLM2 on GSM8K at 4 of 300, cannot be spread over the folds), else of the most balanced tier. ``X``: the
    prompts' features if already computed by ``training_featurizer(model).transform``."""
    correct = np.asarray(correct, dtype=bool)
    prompts = list(prompts)
    splits = outer_splits(correct, groups, folds, seed)
    # Featurized once: nothing in the featurizer is fitted per fold (standardisation is, inside
    # fit_classifier_features), and embedding blocks cost ~25 ms per prompt.
    X = training_featurizer(model).transform(prompts) if X is None else X
    p_fail = np.zeros(correct.shape)
    for train, test in splits:
        fitted = fit_classifier_features(_unfitted_copy(model), X[train], correct[train])
        p_fail[test] = fitted.predict_p_fail_features(X[test])
    return p_fail


def outer_splits(correct: np.ndarray, groups: Sequence[str] | None = None, folds: int = 5,
                 seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (train, test) row indices of `cross_validated_p_fail`'s folds (its docstring says how they are drawn):
    benchmarks that score other estimators out of fold use these so every family is scored on the same folds."""
    from sklearn.model_selection import GroupKFold

    correct = np.asarray(correct, dtype=bool)
    rows = np.zeros(len(correct))
    if groups is not None and len(set(groups)) >= folds:
        return list(GroupKFold(folds).split(rows, groups=list(groups)))
    minority = _minority_counts(correct)
    stratum = _first_tier_with(minority, folds)
    stratum = int(np.argmax(minority)) if stratum is None else stratum
    return list(StratifiedKFold(folds, shuffle=True, random_state=seed).split(rows, correct[:, stratum]))


def _unfitted_copy(model: DifficultyClassifier) -> DifficultyClassifier:
    """A model with ``model``'s parameters and auxiliary models (the ones X's columns came from), nothing else
    fitted."""
    from sklearn.base import clone

    copy: DifficultyClassifier = clone(model)
    for name in ("steps_model_", "topic_model_"):
        if getattr(model, name, None) is not None:
            setattr(copy, name, getattr(model, name))
    return copy
