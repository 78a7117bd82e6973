"""Training the learned router: everything only `cascade router train` and the benchmarks need (fitting the
auxiliary feature models, the classifier's C selection and calibration, cross-validation, the pipeline). The
serving path (cascade/router/learned.py and what it imports) never imports this package; an import-linter
contract in pyproject.toml says so."""

from cascade.router.train.pipeline import TrainedRouter, TrainOptions, train_router

__all__ = ["TrainOptions", "TrainedRouter", "train_router"]
