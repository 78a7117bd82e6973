"""`train_router`, the pipeline of `cascade router train` and of the router benchmarks: deterministic for a seed,
the command's output is the library's, it fits what the benchmarks fitted before they called it, and a router
it trained is served without importing the training part."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys

import msgspec
import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from cascade.cli import main
from cascade.router import evaluate as ev
from cascade.router.classifier import DifficultyClassifier
from cascade.router.cli import add_router_commands
from cascade.router.outcomes import load_outcomes, split_indices
from cascade.router.train import TrainOptions, train_router
from cascade.router.train.estimator import cross_validated_p_fail, fit_classifier_features
from cascade.router.train.pipeline import classifier_for
from tests.router.conftest import GSM8K_TIERS, synthetic_outcomes

# A quarter of RouteLLM's GSM8K (329 rows) trains; the seeded split holds the rest out.
SLICE = TrainOptions(features=("lexical", "restated"), train_fraction=0.25, cv_folds=3, seed=3)


def test_train_router_is_deterministic_for_a_seed_and_the_seed_moves_the_split(gsm8k_csv) -> None:
    outcomes = load_outcomes(gsm8k_csv, GSM8K_TIERS)
    first, again = train_router(outcomes, SLICE), train_router(outcomes, SLICE)
    assert first.metrics == again.metrics
    assert np.array_equal(first.model.coef_, again.model.coef_) and first.calibration == again.calibration
    assert first.train_rows == 329 and first.split_seed == 3
    assert set(first.metrics) == {"cross_validated", "holdout"} and first.metrics["holdout"]["n"] == 990
    other = train_router(outcomes, msgspec.structs.replace(SLICE, seed=4))
    assert other.metrics["holdout"]["apgr"] != first.metrics["holdout"]["apgr"]


def test_the_command_prints_and_saves_what_the_library_returns(gsm8k_csv, tmp_path, capsys) -> None:
    outcomes = load_outcomes(gsm8k_csv, GSM8K_TIERS)
    trained = train_router(outcomes, SLICE)
    code = main(["router", "train", "--outcomes", str(gsm8k_csv), "--tiers", ",".join(GSM8K_TIERS), "--out",
                 str(tmp_path / "router"), "--features", "lexical,restated", "--train-fraction", "0.25",
                 "--cv-folds", "3", "--seed", "3", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(trained.metrics))
    card = json.loads((tmp_path / "router" / "card.json").read_text())
    assert card["data"]["train_rows"] == trained.train_rows and card["seed"] == 3
    # The shared data sits beside the repo: the card names it so, never by this machine's path.
    assert card["data"]["path"] == "../shared/data/routellm/gsm8k_responses.csv"
    from cascade.router.artifact import load_router

    served, _ = load_router(tmp_path / "router")
    prompts = outcomes.prompts[:20]
    assert np.array_equal(served.predict_p_fail(prompts), trained.model.predict_p_fail(prompts))


def test_the_commands_defaults_are_the_options_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_router_commands(parser.add_subparsers())
    args = parser.parse_args(["router", "train", "--outcomes", "o.csv", "--tiers", "a,b", "--out", "r"])
    defaults = TrainOptions()
    assert tuple(args.features.split(",")) == defaults.features == ("lexical",)
    assert (args.aux_data, args.topic_components, args.hash_features, args.estimator, args.alpha, args.C,
            args.selection, args.domain_quantile, not args.no_domain_words, args.domain_embeddings, args.seed,
            args.train_fraction, args.cv_folds, args.costs, args.null_draws) == (
        defaults.aux_data, defaults.topic_components, defaults.hash_features, defaults.estimator, defaults.alpha,
        defaults.C, defaults.selection, defaults.domain_quantile, defaults.domain_words, defaults.domain_embeddings,
        defaults.seed, defaults.train_fraction, defaults.cv_folds, defaults.costs, defaults.null_draws)


def test_the_commands_null_limits_are_the_null_modules() -> None:
    from cascade.router import cli
    from cascade.router.train import null

    assert cli.NULL_DRAWS == null.DEFAULT_DRAWS
    assert f"{null.MIN_DRAWS}-{null.MAX_DRAWS:,}" == cli.NULL_DRAW_LIMITS


def test_the_benchmarks_former_pipeline_and_train_router_fit_the_same_router(gsm8k_csv) -> None:
    """benchmarks/router/quality.py fitted `DifficultyClassifier(**params)` on sliced features
    (`fit_classifier_features`) and ran its own fold loop for the train-half CV; it now calls train_router and
    cross_validated_p_fail."""
    outcomes = load_outcomes(gsm8k_csv, GSM8K_TIERS)
    rows = np.sort(np.random.default_rng(7).permutation(len(outcomes))[:400])
    outcomes = outcomes.subset(rows)
    train_rows, test_rows = split_indices(len(outcomes), 0.5, 0)
    options = TrainOptions(features=("lexical", "restated"), cv_folds=0, domain_quantile=0.0)
    X = classifier_for(options).featurizer().transform(outcomes.prompts)
    before = fit_classifier_features(DifficultyClassifier(restated_number=True), X[train_rows], outcomes.correct[train_rows])
    after = train_router(outcomes.subset(train_rows), options, X=X[train_rows]).model
    assert np.array_equal(before.predict_p_fail_features(X[test_rows]), after.predict_p_fail_features(X[test_rows]))

    correct = outcomes.correct[train_rows]
    folds = StratifiedKFold(5, shuffle=True, random_state=2).split(X[train_rows], correct[:, 0])
    looped = np.zeros(correct.shape)
    for fit, score in folds:
        fold_model = fit_classifier_features(DifficultyClassifier(restated_number=True), X[train_rows][fit], correct[fit])
        looped[score] = fold_model.predict_p_fail_features(X[train_rows][score])
    library = cross_validated_p_fail(classifier_for(options), [outcomes.prompts[i] for i in train_rows], correct,
                                     folds=5, seed=2, X=X[train_rows])
    assert np.array_equal(looped, library)
    assert ev.apgr(ev.routing_curve(library, correct)) == ev.apgr(ev.routing_curve(looped, correct))


def test_a_trained_router_is_served_without_importing_the_training_part(tmp_path, steps_jsonl) -> None:
    from cascade.router.outcomes import Outcomes

    prompts, correct = synthetic_outcomes(n=160, seed=2)
    outcomes = Outcomes(ids=[str(i) for i in range(len(prompts))], prompts=prompts, correct=correct,
                        tiers=["weak", "strong"], groups=["synthetic"] * len(prompts), sha256="0" * 64)
    options = TrainOptions(features=("lexical", "steps", "restated"), aux_data=str(steps_jsonl), cv_folds=3)
    trained = train_router(outcomes, options)
    trained.save(tmp_path / "router", source="synthetic")
    code = ("import sys; from cascade.router.learned import LearnedSignal; "
            "signal = LearnedSignal.load(sys.argv[1], ['weak', 'strong']); "
            "print(repr(signal.assess(sys.argv[2]).p_fail)); "
            "print(sorted(m for m in sys.modules if m.startswith('cascade.router.train')))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "router"), prompts[0]], capture_output=True,
                         text=True, check=True, timeout=120).stdout.splitlines()
    assert out[1] == "[]"
    assert ast.literal_eval(out[0]) == pytest.approx(tuple(trained.model.predict_p_fail(prompts[:1])[0]))
