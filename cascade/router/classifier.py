"""The difficulty classifier: per-tier calibrated probability that the tier answers wrongly (`p_fail`).

Model (one per tier; fitted attributes end in `_`, scikit-learn's convention):

1. features from `Featurizer` (lexical, steps, restated and topic columns standardised with the training mean
   and scale). With the ``steps`` block, fitting first fits the auxiliary `StepsModel` on ``steps_data`` (cached
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
0.679 vs 0.683 mean over 8 splits (lexical + steps; benchmarks/router/quality.py). Kept as an option,
not the default.

``estimator="knn"`` replaces 2-3 by kNN over the prompt's MiniLM embedding (cascade/router/knn.py: its k nearest
training prompts' failures, distance-weighted, smoothed toward the tier's failure rate; k and m per tier by
cross-validated log loss). It needs ``embeddings`` (the minilm block) and no other block, and the router carries
the training prompts' embeddings. Measured out of fold (docs/measured.md, "Router signals beyond the text"): no
better than the text router -- embedded ladder 0.590 vs 0.599 mean APGR over 5 fold assignments, unseen MMLU
subjects 0.594 vs 0.594, RouteLLM GSM8K 0.131 below. Kept as the opt-in baseline a new family must beat.

At prediction time the whole model is a matrix product and a sigmoid (or a clip) in numpy: no sklearn call
on the request path. This module is only that prediction side (what a loaded router runs) and imports nothing of
cascade/router/train/, which holds the fitting -- C selection, the folds, Platt calibration, the domain check's
fit, the auxiliary models: ``fit_classifier(DifficultyClassifier(...), prompts, correct)`` (and
``fit_classifier_features`` on features from ``training_featurizer(model)``) fit a model and return it. So the
class has no `fit`: a model is either loaded (`cascade.router.artifact.load_router`) or fitted there, and
`featurizer()` refuses a model that lacks the auxiliary models its feature spec needs (import-linter forbids the
import; tests/router/test_train_router.py serves a router and checks the train part was never imported).
The class keeps its name and module path: saved routers (skops files) name it.
A tier that never (or always) failed in training gets a constant, Laplace-smoothed p_fail.

Routing: the gateway routes by the route score of p_fail and a hint's thresholds (cascade/router/operating.py);
`cascade router eval` measures the price sweep over p_fail (cascade/router/evaluate.py), whose two-tier curve
ranks prompts as the route score does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from cascade.router import knn
from cascade.router.domain import DEFAULT_QUANTILE, WordModel, excess, residual
from cascade.router.embeddings import TOPIC_EMBEDDINGS, embed
from cascade.router.feature_cache import FeatureCache
from cascade.router.features import FeatureSpec, Featurizer

SELECTIONS = ("log_loss", "log_loss_1se", "apgr")
ESTIMATORS = ("logistic", "linear", "knn")
DEFAULT_CS = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)
DEFAULT_ALPHA = 300.0
Z_LIMIT = 8.0
P_MIN = 0.001  # linear estimator: probabilities are clipped to [P_MIN, 1 - P_MIN]


class DifficultyClassifier(BaseEstimator):
    """Predicts `p_fail` (n_prompts, n_tiers), tiers cheapest first. Difficulty is column 0."""

    def __init__(self, *, lexical: bool = True, hash_features: int = 0, embeddings: str | None = None,
                 embedding_weight: float = 3.0, steps: bool = False, steps_data: str | None = None,
                 restated_number: bool = False, topic_components: int = 0, hidden_states: str | None = None,
                 estimator: str = "logistic",
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
        self.hidden_states = hidden_states
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
                           restated_number=self.restated_number, topic_components=self.topic_components,
                           hidden_states=self.hidden_states)

    def featurizer(self, states_cache: FeatureCache | None = None) -> Featurizer:
        """The featurizer of this model: with the steps or topic block, over its fitted auxiliary model. Raises
        NotFittedError when the model lacks one: cascade.router.train fits a model, auxiliary models included
        (``training_featurizer(model)`` there gives the features of a model not fitted yet)."""
        needed = {"steps_model_": self.steps, "topic_model_": bool(self.topic_components)}
        missing = [name for name, used in needed.items() if used and getattr(self, name, None) is None]
        if missing:
            raise NotFittedError(
                f"this DifficultyClassifier has no fitted {' or '.join(missing)} (its feature spec uses the "
                f"{' and '.join(m.split('_')[0] for m in missing)} block{'s' if len(missing) > 1 else ''}): fit "
                "it with cascade.router.train.fit_classifier, or take its training features from "
                "cascade.router.train.training_featurizer(model), which fits the auxiliary models")
        return Featurizer(self.spec, self.steps_model_ if self.steps else None,
                          self.topic_model_ if self.topic_components else None, states_cache)

    def domain_excess_features(self, X: np.ndarray) -> np.ndarray | None:
        """How far each prompt's dense features lie outside the training prompts' range, summed, in training
        standard deviations (None: no domain check, e.g. saved before there was one, or quantile 0)."""
        low, high = getattr(self, "domain_low_", None), getattr(self, "domain_high_", None)
        if low is None or high is None:
            return None
        Z = self.standardize(np.asarray(X, dtype=float))[:, : self.spec.dense_columns]
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

    def standardize(self, X: np.ndarray) -> np.ndarray:
        # Clipped at +-8 standard deviations: one absurd feature of an unseen prompt (a 5000-letter
        # "word") must not decide its route alone.
        return np.clip((X - self.mean_) / self.scale_, -Z_LIMIT, Z_LIMIT)

    def predict_p_fail_features(self, X: np.ndarray) -> np.ndarray:
        if self.estimator == "knn":  # the embedding columns are X's last (the features' order)
            reference = self.knn_reference_
            return knn.predict_p_fail(np.asarray(X, dtype=float)[:, -reference.shape[1]:], reference,
                                      self.knn_failed_, self.knn_prior_, self.knn_k_, self.knn_m_)
        # einsum, not BLAS: no thread start-up or spinning on the request path.
        decision = np.einsum("ij,tj->it", self.standardize(X), self.coef_) + self.intercept_
        if self.estimator == "linear":
            return np.clip(decision, P_MIN, 1.0 - P_MIN)
        logit = decision * self.calibration_[:, 0] + self.calibration_[:, 1]
        # Clipped: a prompt far outside the training data must give p near 0 or 1, not an overflow.
        return 1.0 / (1.0 + np.exp(-np.clip(logit, -40.0, 40.0)))

    def predict_p_fail(self, prompts: Sequence[str]) -> np.ndarray:
        """Calibrated probability that each tier answers wrongly, shape (n_prompts, n_tiers)."""
        return self.predict_p_fail_features(self.featurizer().transform(list(prompts)))


_PARAMS_ADDED_LATER = {"steps": False, "steps_data": None, "estimator": "logistic", "alpha": DEFAULT_ALPHA,
                       "restated_number": False, "topic_components": 0, "domain_quantile": 0.0,
                       "domain_embeddings": False, "domain_words": False, "hidden_states": None}

