"""Training the learned router: everything only `cascade router train` and the benchmarks need (fitting the
auxiliary feature models, the classifier's C selection and calibration, cross-validation, the pipeline). The
classifier itself (cascade/router/classifier.py) only predicts: `fit_classifier` fits one. The
serving path (cascade/router/learned.py and what it imports) never imports this package; an import-linter
contract in pyproject.toml says so."""

from cascade.router.train.aux_models import training_featurizer
from cascade.router.train.estimator import cross_validated_p_fail, fit_classifier, fit_classifier_features
from cascade.router.train.pipeline import TrainedRouter, TrainOptions, train_router

__all__ = ["TrainOptions", "TrainedRouter", "cross_validated_p_fail", "fit_classifier", "fit_classifier_features",
           "train_router", "training_featurizer"]
