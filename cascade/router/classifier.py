"""The difficulty classifier: per-tier calibrated probability that the tier answers wrongly (`p_fail`).

Model (one per tier, scikit-learn conventions: `fit` returns self, fitted attributes end in `_`):

1. features from `Featurizer` (lexical, steps, restated and topic columns standardised with the training mean
   and scale). With the ``steps`` block, `fit` first fits the auxiliary `StepsModel` on ``steps_data`` (cached
   per process) and keeps it as ``steps_model_``; with ``topic_components`` it fits the `TopicModel` on the
   same file's questions and keeps it as ``topic_model_``. So the saved router carries both;
2. an L2 logistic regression for "tier t fails". Its strength C is chosen per tier from `Cs` by k-fold
   cross-validated log loss (``selection="log_loss"``; or fixed by ``C``). Small data wants strong
   shrinkage. ``"log_loss_1se"`` takes the smallest C within one standard error of the best (measured:
   better across unseen MMLU subjects, 0.592 vs 0.554 pooled APGR; worse on GSM8K, 0.654 vs 0.679 mean
   over 8 splits); ``"apgr"`` picks the C with the best out-of-fold APGR (measured worse on both: it
   overfits a noisy criterion);
3. Platt calibration: a one-dimensional logistic regression on the *out-of-fold* decision values
   (the same folds), so the probabilities are calibrated on data the model did not see.
4. a domain check (cascade/router/domain.py, ``domain_quantile``): the training prompts' range of the dense
   standardised columns and a held-out threshold, so the gateway can tell a prompt the model has never seen
   the like of (`out_of_domain`) and not trust its extrapolation; with ``domain_embeddings`` also
   from the distance of its MiniLM embedding to the plane of the training prompts'.

``estimator="linear"`` replaces 2-3 by a ridge linear-probability model per tier with one fixed ``alpha``
for all tiers, p_fail[t] = clip(z . w_t + b_t, P_MIN, 1 - P_MIN), and no recalibration (a per-tier
rescaling would re-weight the tiers in the gain): the expected gain p_fail[0] - p_fail[1] is then a ridge
regression of ``correct[:, 1] - correct[:, 0]`` itself. It looked better in 5-fold CV (6 repeats) on the
training half of RouteLLM GSM8K (0.656 vs 0.640 APGR, lexical; 0.663 vs 0.643 with steps; alpha 300
from a plateau 150..500) but not on held-out prompts: 0.649 vs 0.682 on that split's test half and
0.679 vs 0.683 mean over 8 splits (lexical + steps; benchmarks/router_quality.py). Kept as an option,
not the default.

At prediction time the whole model is a matrix product and a sigmoid (or a clip) in numpy: no sklearn call
on the request path. A tier that never (or always) failed in training gets a constant, Laplace-smoothed p_fail.

Routing (see `tier_for_price`): with calibrated p_fail per tier the expected quality of tier t is
``1 - p_fail[t]``; for a price ``lam`` per unit of cost the best tier minimises ``p_fail[t] + lam * cost[t]``.
For two tiers this routes up exactly when the expected gain ``p_fail[0] - p_fail[1]`` exceeds ``lam``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from cascade.errors import ConfigError
from cascade.router.domain import (
    DEFAULT_QUANTILE,
    WordModel,
    excess,
    fit_domain,
    fit_embedding_plane,
    fit_word_model,
    residual,
)
from cascade.router.features import (
    TOPIC_EMBEDDINGS,
    FeatureSpec,
    Featurizer,
    StepsModel,
    TopicModel,
    embed,
    fit_steps_model,
    fit_topic_model,
)

FEATURE_BLOCKS = ("lexical", "hash", "minilm", "steps", "restated", "topic")  # `cascade router train --features`
SELECTIONS = ("log_loss", "log_loss_1se", "apgr")
ESTIMATORS = ("logistic", "linear")
DEFAULT_CS = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)
DEFAULT_ALPHA = 300.0
Z_LIMIT = 8.0
P_MIN = 0.001  # linear estimator: probabilities are clipped to [P_MIN, 1 - P_MIN]


class DifficultyClassifier(BaseEstimator):
    """Predicts `p_fail` (n_prompts, n_tiers), tiers cheapest first. Difficulty is column 0."""

    def __init__(self, *, lexical: bool = True, hash_features: int = 0, embeddings: str | None = None,
                 embedding_weight: float = 3.0, steps: bool = False, steps_data: str | None = None,
                 restated_number: bool = False, topic_components: int = 0, estimator: str = "logistic",
                 alpha: float = DEFAULT_ALPHA,
                 C: float | None = None, Cs: Sequence[float] = DEFAULT_CS, cv: int = 5, selection: str = "log_loss",
                 domain_quantile: float = DEFAULT_QUANTILE, domain_embeddings: bool = False,
                 domain_words: bool = True, random_state: int = 0) -> None:
        self.lexical = lexical
        self.hash_features = hash_features
        self.embeddings = embeddings
        self.embedding_weight = embedding_weight
        self.steps = steps
        self.steps_data = steps_data
        self.restated_number = restated_number
        self.topic_components = topic_components
        self.estimator = estimator
        self.alpha = alpha
        self.C = C
        self.Cs = Cs
        self.cv = cv
        self.selection = selection
        self.domain_quantile = domain_quantile
        self.domain_embeddings = domain_embeddings
        self.domain_words = domain_words
        self.random_state = random_state

    def __setstate__(self, state: dict) -> None:
        # A model saved before a parameter existed loads with that parameter's default.
        super().__setstate__({**_PARAMS_ADDED_LATER, **state})

    @property
    def spec(self) -> FeatureSpec:
        return FeatureSpec(lexical=self.lexical, hash_features=self.hash_features, embeddings=self.embeddings,
                           embedding_weight=self.embedding_weight, steps=self.steps,
                           restated_number=self.restated_number, topic_components=self.topic_components)

    def featurizer(self) -> Featurizer:
        """The featurizer of this model. With the steps or topic block: the fitted auxiliary model (fitted
        here if the classifier is not fitted yet)."""
        return Featurizer(self.spec, self._steps_model() if self.steps else None,
                          self._topic_model() if self.topic_components else None)

    def _steps_model(self) -> StepsModel:
        if getattr(self, "steps_model_", None) is None:
            self.steps_model_ = fit_steps_model(self.steps_data)
        return self.steps_model_

    def _topic_model(self) -> TopicModel:
        if getattr(self, "topic_model_", None) is None:
            self.topic_model_ = fit_topic_model(self.steps_data, self.topic_components)
        return self.topic_model_

    def fit(self, prompts: Sequence[str], correct: np.ndarray,
            groups: Sequence[str] | None = None) -> DifficultyClassifier:
        """Fit one calibrated model per tier. ``groups`` (e.g. subjects), when there are at least ``cv``
        of them, make the internal folds grouped, so C is chosen for unseen groups."""
        # Auxiliary models are refitted from steps_data by featurizer() (cached per process and file content).
        self.__dict__.pop("steps_model_", None)
        self.__dict__.pop("topic_model_", None)
        self.fit_features(self.featurizer().transform(list(prompts)), correct, groups)
        checked = self.domain_quantile > 0
        self.domain_words_ = (fit_word_model(prompts, self.domain_quantile, self.random_state)
                              if checked and self.domain_words else None)
        plane = None
        if checked and self.domain_embeddings:
            plane = fit_embedding_plane(embed(TOPIC_EMBEDDINGS, list(prompts)), self.domain_quantile,
                                        self.random_state)
        self.domain_plane_mean_ = None if plane is None else plane.mean
        self.domain_plane_axes_ = None if plane is None else plane.axes
        self.domain_residual_threshold_ = None if plane is None else plane.threshold
        return self

    def fit_features(self, X: np.ndarray, correct: np.ndarray,
                     groups: Sequence[str] | None = None) -> DifficultyClassifier:
        """`fit` on features already computed by ``self.featurizer().transform`` (e.g. embeddings computed
        once for many cross-validation folds). The steps and topic columns must come from
        ``fit_steps_model(steps_data)`` and ``fit_topic_model(steps_data, topic_components)`` (cached per
        process: the models this classifier keeps)."""
        from threadpoolctl import threadpool_limits

        # Small dense problems: BLAS threads only contend (measured 6x slower with 2 threads on 2 cores).
        with threadpool_limits(limits=1, user_api="blas"):
            return self._fit(np.asarray(X, dtype=float), correct, groups)

    def _fit(self, X: np.ndarray, correct: np.ndarray, groups: Sequence[str] | None) -> DifficultyClassifier:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")
        correct = np.asarray(correct, dtype=bool)
        featurizer = self.featurizer()
        if correct.ndim != 2 or correct.shape[0] != len(X) or correct.shape[1] < 1:
            raise ValueError(f"correct must be (n_prompts, n_tiers) = ({len(X)}, T), got {correct.shape}")
        if X.shape[1] != len(featurizer.names):
            raise ValueError(f"X has {X.shape[1]} columns; the feature spec makes {len(featurizer.names)}")
        mask = featurizer.standardize_mask
        self.mean_ = np.where(mask, X.mean(axis=0), 0.0)
        scale = X.std(axis=0)
        # A feature constant in training has a std of float noise (~1e-17): dividing by it would blow an
        # unseen prompt's value up to 1e11+. Such features get scale 1 (and so ~zero weight).
        varies = scale > 1e-9 * np.maximum(1.0, np.abs(X).max(axis=0))
        self.scale_ = np.where(mask & varies, scale, 1.0)
        Z = self._standardize(X)
        failed = ~correct
        n_tiers = correct.shape[1]
        self.coef_ = np.zeros((n_tiers, Z.shape[1]))
        self.intercept_ = np.zeros(n_tiers)
        self.calibration_ = np.tile([1.0, 0.0], (n_tiers, 1))
        self.C_ = np.full(n_tiers, np.nan)
        self.n_tiers_ = n_tiers
        self.n_features_in_ = Z.shape[1]
        self.feature_names_ = featurizer.names
        self._fit_domain(Z[:, mask])
        if self.estimator == "linear":
            return self._fit_linear(Z, failed)
        folds = self._folds(failed, groups)
        learnable = [t for t in range(n_tiers) if folds and _both_classes(failed[:, t], folds)]
        for t in set(range(n_tiers)) - set(learnable):  # (almost) one class: a smoothed constant
            rate = (failed[:, t].sum() + 1) / (len(failed) + 2)
            self.intercept_[t] = np.log(rate / (1 - rate))
        candidates = [self.C] if self.C is not None else list(self.Cs)
        oof = {C: {t: _oof_decision(Z, failed[:, t], C, folds) for t in learnable} for C in candidates}
        for t in learnable:
            if self.selection != "apgr" or len(learnable) < 2:
                self.C_[t] = _select_C(candidates, [_losses(_platt(oof[C][t], failed[:, t]), failed[:, t])
                                                    for C in candidates], one_se=self.selection == "log_loss_1se")
        if self.selection == "apgr" and len(learnable) >= 2:
            from cascade.router.evaluate import apgr, routing_curve

            def score(C: float) -> float:
                p_fail = np.tile(1.0 / (1.0 + np.exp(-self.intercept_)), (len(Z), 1))
                for t in learnable:
                    p_fail[:, t] = _platt(oof[C][t], failed[:, t])
                return apgr(routing_curve(p_fail, correct))

            best = max(candidates, key=score)  # first (smallest) C wins ties
            self.C_[learnable] = best
        for t in learnable:
            model = LogisticRegression(C=float(self.C_[t]), max_iter=5000).fit(Z, failed[:, t])
            platt = _platt_model(oof[float(self.C_[t])][t], failed[:, t])
            self.coef_[t] = model.coef_[0]
            self.intercept_[t] = model.intercept_[0]
            self.calibration_[t] = [platt.coef_[0, 0], platt.intercept_[0]]
        return self

    def _fit_domain(self, Z_dense: np.ndarray) -> None:
        # The out-of-domain check (cascade/router/domain.py) on the dense standardised columns; 0 turns it off.
        fit = fit_domain(Z_dense, self.domain_quantile, self.random_state) if self.domain_quantile > 0 else None
        self.domain_low_ = None if fit is None else fit.low
        self.domain_high_ = None if fit is None else fit.high
        self.domain_threshold_ = None if fit is None else fit.threshold

    def domain_excess_features(self, X: np.ndarray) -> np.ndarray | None:
        """How far each prompt's dense features lie outside the training prompts' range, summed, in training
        standard deviations (None: no domain check, e.g. saved before there was one, or quantile 0)."""
        low, high = getattr(self, "domain_low_", None), getattr(self, "domain_high_", None)
        if low is None or high is None:
            return None
        Z = self._standardize(np.asarray(X, dtype=float))[:, : self.spec.dense_columns]
        return excess(Z, low, high)

    def out_of_domain(self, prompts: Sequence[str], X: np.ndarray | None = None) -> np.ndarray:
        """True where a prompt is unlike the training prompts (never, without a domain check): its features
        lie outside their training range, its wording is unlike theirs (``domain_words``), or
        (``domain_embeddings``) its embedding lies off their plane. ``X``: the
        prompts' features if already computed by ``featurizer().transform``."""
        X = self.featurizer().transform(list(prompts)) if X is None else X
        scores = self.domain_excess_features(X)
        flagged = np.zeros(len(X), dtype=bool) if scores is None else scores > self.domain_threshold_
        words: WordModel | None = getattr(self, "domain_words_", None)
        if words is not None:
            flagged |= words.surprise(list(prompts)) > words.threshold
        distances = self.domain_residual(prompts)
        return flagged if distances is None else flagged | (distances > self.domain_residual_threshold_)

    def domain_residual(self, prompts: Sequence[str]) -> np.ndarray | None:
        """Distance of each prompt's MiniLM embedding to the plane of the training prompts' (None: the router
        has no embedding test)."""
        mean, axes = getattr(self, "domain_plane_mean_", None), getattr(self, "domain_plane_axes_", None)
        if mean is None or axes is None:
            return None
        return residual(embed(TOPIC_EMBEDDINGS, list(prompts)), mean, axes)

    def _fit_linear(self, Z: np.ndarray, failed: np.ndarray) -> DifficultyClassifier:
        for t in range(failed.shape[1]):
            if 0 < failed[:, t].sum() < len(failed):
                model = Ridge(alpha=self.alpha).fit(Z, failed[:, t].astype(float))
                self.coef_[t], self.intercept_[t] = model.coef_, model.intercept_
            else:  # one class: a smoothed constant
                self.intercept_[t] = (failed[:, t].sum() + 1) / (len(failed) + 2)
        return self

    def _folds(self, failed: np.ndarray, groups: Sequence[str] | None) -> list[tuple[np.ndarray, np.ndarray]]:
        from sklearn.model_selection import GroupKFold

        if groups is not None and len(set(groups)) >= self.cv:
            return list(GroupKFold(self.cv).split(failed, groups=list(groups)))
        # Stratify on the cheapest tier that both fails and succeeds (a weak tier may never succeed:
        # stratifying on it would leave no folds, and so no learned tier at all).
        minority = _minority_counts(failed)
        t = _first_tier_with(minority, 2)
        if t is None:
            return []
        splitter = StratifiedKFold(min(self.cv, int(minority[t])), shuffle=True, random_state=self.random_state)
        return list(splitter.split(failed, failed[:, t]))

    def _standardize(self, X: np.ndarray) -> np.ndarray:
        # Clipped at +-8 standard deviations: one absurd feature of an unseen prompt (a 5000-letter
        # "word") must not decide its route alone.
        return np.clip((X - self.mean_) / self.scale_, -Z_LIMIT, Z_LIMIT)

    def predict_p_fail_features(self, X: np.ndarray) -> np.ndarray:
        # einsum, not BLAS: no thread start-up or spinning on the request path.
        decision = np.einsum("ij,tj->it", self._standardize(X), self.coef_) + self.intercept_
        if self.estimator == "linear":
            return np.clip(decision, P_MIN, 1.0 - P_MIN)
        logit = decision * self.calibration_[:, 0] + self.calibration_[:, 1]
        # Clipped: a prompt far outside the training data must give p near 0 or 1, not an overflow.
        return 1.0 / (1.0 + np.exp(-np.clip(logit, -40.0, 40.0)))

    def predict_p_fail(self, prompts: Sequence[str]) -> np.ndarray:
        """Calibrated probability that each tier answers wrongly, shape (n_prompts, n_tiers)."""
        return self.predict_p_fail_features(self.featurizer().transform(list(prompts)))

    def difficulty(self, prompt: str) -> float:
        """p_fail of the cheapest tier for one prompt (DESIGN.md §3)."""
        return float(self.predict_p_fail([prompt])[0, 0])


_PARAMS_ADDED_LATER = {"steps": False, "steps_data": None, "estimator": "logistic", "alpha": DEFAULT_ALPHA,
                       "restated_number": False, "topic_components": 0, "domain_quantile": 0.0,
                       "domain_embeddings": False, "domain_words": False}


def classifier_for_blocks(blocks: Sequence[str], *, hash_features: int = 1024, topic_components: int = 4,
                          aux_data: str | None = None, **options: Any) -> DifficultyClassifier:
    """The classifier for feature blocks named as `cascade router train --features` names them (FEATURE_BLOCKS);
    ``aux_data`` trains the steps and topic blocks, ``options`` are the other constructor arguments."""
    unknown = [b for b in blocks if b not in FEATURE_BLOCKS]
    if unknown or not blocks:
        raise ConfigError(f"feature blocks are {', '.join(FEATURE_BLOCKS)}, got {','.join(blocks)!r}")
    return DifficultyClassifier(
        lexical="lexical" in blocks, hash_features=hash_features if "hash" in blocks else 0,
        embeddings="all-minilm-l6-v2" if "minilm" in blocks else None, steps="steps" in blocks,
        steps_data=aux_data, restated_number="restated" in blocks,
        topic_components=topic_components if "topic" in blocks else 0, **options)


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


def tier_for_price(p_fail: np.ndarray, costs: Sequence[float], price: float) -> int:
    """The tier maximising expected quality minus ``price`` times cost: argmin p_fail[t] + price * cost[t].
    Ties go to the cheaper tier. ``price`` = +inf keeps tier 0; -inf picks the top tier."""
    if price == np.inf:
        return 0
    if price == -np.inf:
        return len(costs) - 1
    objective = np.asarray(p_fail, dtype=float) + price * np.asarray(costs, dtype=float)
    return int(np.flatnonzero(objective <= objective.min() + 1e-12)[0])


def cross_validated_p_fail(model: DifficultyClassifier, prompts: Sequence[str], correct: np.ndarray,
                           groups: Sequence[str] | None = None, folds: int = 5, seed: int = 0) -> np.ndarray:
    """Out-of-fold p_fail for every prompt. With at least `folds` distinct groups (e.g. MMLU subjects) the
    folds are grouped (no group in both train and test); otherwise stratified on the failures of the cheapest
    tier that fails and succeeds at least `folds` times each (a weak tier that is almost never right, like
    SmolLM2 on GSM8K at 4 of 300, cannot be spread over the folds), else of the most balanced tier."""
    from sklearn.base import clone
    from sklearn.model_selection import GroupKFold

    correct = np.asarray(correct, dtype=bool)
    prompts = list(prompts)
    if groups is not None and len(set(groups)) >= folds:
        splits = GroupKFold(folds).split(prompts, groups=list(groups))
    else:
        minority = _minority_counts(correct)
        stratum = _first_tier_with(minority, folds)
        stratum = int(np.argmax(minority)) if stratum is None else stratum
        splits = StratifiedKFold(folds, shuffle=True, random_state=seed).split(prompts, correct[:, stratum])
    # Featurized once: nothing in the featurizer is fitted per fold (standardisation is, inside fit_features),
    # and embedding blocks cost ~25 ms per prompt.
    X = model.featurizer().transform(prompts)
    p_fail = np.zeros(correct.shape)
    for train, test in splits:
        fitted = clone(model).fit_features(X[train], correct[train])
        p_fail[test] = fitted.predict_p_fail_features(X[test])
    return p_fail
