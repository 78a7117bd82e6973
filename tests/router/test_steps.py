"""The steps block: an auxiliary model of a word problem's solution steps, fitted on GSM8K-format data, carried
inside the router artifact, predicted in numpy; and the linear estimator."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import Ridge

from cascade.cli import main
from cascade.errors import ConfigError
from cascade.repo_paths import OUTSIDE
from cascade.router import evaluate as ev
from cascade.router.artifact import CARD_FILE, MODEL_FILE, DataRef, load_router, save_router
from cascade.router.classifier import P_MIN, DifficultyClassifier
from cascade.router.features import FeatureSpec, Featurizer
from cascade.router.lexical import LEXICAL_NAMES, lexical_features
from cascade.router.train.aux_models import fit_steps_model, solution_steps, training_featurizer
from cascade.router.train.estimator import fit_classifier
from tests.router.conftest import synthetic_outcomes, synthetic_solutions
from tests.shared_data import shared_file


def _predict_steps(model, prompts: list[str]) -> np.ndarray:
    return model.predict(prompts, np.array([lexical_features(p) for p in prompts]))


def test_solution_steps_counts_the_non_empty_lines_before_the_final_answer() -> None:
    assert solution_steps("He buys 2+3=<<2+3=5>>5.\n\nThen 5*2=<<5*2=10>>10.\n#### 10") == 2
    assert solution_steps("#### 4") == 0


def test_steps_model_predicts_more_steps_for_questions_with_more_clauses(steps_jsonl) -> None:
    model = fit_steps_model(steps_jsonl)
    held_out = synthetic_solutions(n=120, seed=1)
    truth = np.array([solution_steps(r["answer"]) for r in held_out])
    predicted = _predict_steps(model, [r["question"] for r in held_out])
    assert np.corrcoef(predicted, truth)[0, 1] > 0.9
    assert model.cv_r2 > 0.8 and model.n_rows == 300 and len(model.data_sha256) == 64


def test_steps_model_is_deterministic_and_identical_in_another_process(steps_jsonl) -> None:
    prompt = synthetic_solutions(n=1, seed=5)[0]["question"]
    ours = float(_predict_steps(fit_steps_model(steps_jsonl), [prompt])[0])
    code = ("import sys, numpy as np; from cascade.router.train.aux_models import fit_steps_model; "
            "from cascade.router.lexical import lexical_features; "
            "m = fit_steps_model(sys.argv[1]); p = sys.argv[2]; "
            "print(repr(float(m.predict([p], np.array([lexical_features(p)]))[0])))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # str hashes differ; the crc32 buckets must not
    out = subprocess.run([sys.executable, "-c", code, str(steps_jsonl), prompt], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert float(out) == ours


def test_steps_data_that_is_not_gsm8k_format_is_one_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: expected a JSON object with `question` and `answer`"):
        fit_steps_model(bad)
    with pytest.raises(ConfigError, match=r"cannot read the aux data"):
        fit_steps_model(tmp_path / "missing.jsonl")


def test_featurizer_appends_a_standardised_predicted_steps_column(steps_jsonl) -> None:
    steps = fit_steps_model(steps_jsonl)
    featurizer = Featurizer(FeatureSpec(steps=True), steps)
    assert featurizer.names == [*LEXICAL_NAMES, "predicted_steps"]
    assert featurizer.standardize_mask.all()
    prompts = [r["question"] for r in synthetic_solutions(n=5, seed=2)]
    X = featurizer.transform(prompts)
    assert np.allclose(X[:, -1], _predict_steps(steps, prompts))
    with pytest.raises(ConfigError, match="no steps model"):
        Featurizer(FeatureSpec(steps=True))


def test_classifier_with_only_the_steps_block_ranks_held_out_prompts(steps_jsonl) -> None:
    prompts, correct = synthetic_outcomes(n=400, seed=3)
    model = fit_classifier(DifficultyClassifier(lexical=False, steps=True, steps_data=str(steps_jsonl)),
                           prompts[:200], correct[:200])
    assert model.feature_names_ == ["predicted_steps"] and model.steps_model_.n_rows == 300
    assert ev.report(model.predict_p_fail(prompts[200:]), correct[200:])["apgr"] > 0.6
    # A clone refits the (cached) steps model from the same file: same predictions.
    again = fit_classifier(clone(model), prompts[:200], correct[:200])
    assert np.array_equal(again.predict_p_fail(prompts[200:]), model.predict_p_fail(prompts[200:]))


@pytest.mark.parametrize("params", [{"steps": True}, {"topic_components": 2}], ids=["steps", "topic"])
def test_featurizer_refuses_a_classifier_without_its_fitted_aux_model_and_the_train_part_fits_it(params,
                                                                                              steps_jsonl) -> None:
    """The classifier only predicts: its featurizer() never fits an auxiliary model (the train part does)."""
    unfitted = DifficultyClassifier(**params, steps_data=str(steps_jsonl))
    with pytest.raises(NotFittedError, match=r"no fitted (steps|topic)_model_ .*training_featurizer\(model\)"):
        unfitted.featurizer()
    with pytest.raises(NotFittedError):
        unfitted.predict_p_fail(["How many apples are left?"])
    assert not hasattr(unfitted, "fit") and not hasattr(unfitted, "fit_features")
    if "steps" in params:
        featurizer = training_featurizer(unfitted)
        assert unfitted.steps_model_ is fit_steps_model(steps_jsonl)
        assert featurizer.names == unfitted.featurizer().names == [*LEXICAL_NAMES, "predicted_steps"]


@pytest.fixture
def saved_steps_router(tmp_path, steps_jsonl):
    prompts, correct = synthetic_outcomes(n=200, seed=4)
    model = fit_classifier(DifficultyClassifier(steps=True, steps_data=str(steps_jsonl), C=0.1), prompts, correct)
    data = DataRef(path="synthetic", sha256="0" * 64, n_rows=len(prompts), train_rows=len(prompts))
    save_router(model, tmp_path / "router", tiers=["weak", "strong"], data=data, metrics={})
    return tmp_path / "router", model, prompts, steps_jsonl


def test_a_steps_router_round_trips_without_its_training_data(saved_steps_router) -> None:
    router_dir, model, prompts, steps_jsonl = saved_steps_router
    expected = model.predict_p_fail(prompts)
    steps_jsonl.unlink()  # serving needs only the artifact
    loaded, card = load_router(router_dir)
    assert np.array_equal(loaded.predict_p_fail(prompts), expected)
    assert card.feature_spec.steps and [a.block for a in card.aux_data] == ["steps"]
    # A file outside the repo is recorded by its name (cascade/repo_paths.py), never by this machine's path.
    assert card.aux_data[0].path == steps_jsonl.name + OUTSIDE == model.steps_model_.data_path
    assert card.aux_data[0].sha256 == model.steps_model_.data_sha256


def test_a_steps_router_predicts_without_calling_sklearn(saved_steps_router, monkeypatch) -> None:
    import sklearn.feature_extraction.text as text
    import sklearn.linear_model as linear

    router_dir, model, prompts, _ = saved_steps_router
    loaded, _ = load_router(router_dir)
    expected = model.predict_p_fail(prompts[:3])

    def forbidden(*args, **kwargs):
        raise AssertionError("sklearn called on the request path")

    for owner, name in ((linear.Ridge, "predict"), (linear.LogisticRegression, "decision_function"),
                        (linear.LogisticRegression, "predict_proba"), (text.HashingVectorizer, "transform")):
        monkeypatch.setattr(owner, name, forbidden)
    assert np.array_equal(loaded.predict_p_fail(prompts[:3]), expected)


def test_a_steps_router_whose_card_names_other_aux_data_is_refused(saved_steps_router) -> None:
    router_dir = saved_steps_router[0]
    path = router_dir / CARD_FILE
    card = json.loads(path.read_text())
    card["aux_data"][0]["sha256"] = "f" * 64
    path.write_text(json.dumps(card))
    with pytest.raises(ConfigError, match=r"auxiliary model data differ"):
        load_router(router_dir)


def test_a_steps_router_whose_aux_data_was_read_elsewhere_still_loads(saved_steps_router) -> None:
    """The aux data's sha256 identifies it; its path only says where one machine read it (a committed card names
    `../shared/data/...` while a router fitted before that holds `/work/shared/data/...`)."""
    router_dir, model, prompts, _ = saved_steps_router
    path = router_dir / CARD_FILE
    card = json.loads(path.read_text())
    card["aux_data"][0]["path"] = "/another/machine/train.jsonl"
    path.write_text(json.dumps(card))
    loaded, _ = load_router(router_dir)
    assert np.array_equal(loaded.predict_p_fail(prompts), model.predict_p_fail(prompts))


def test_a_router_saved_before_the_new_parameters_existed_still_loads(tmp_path, synthetic) -> None:
    import hashlib

    import skops.io as sio

    prompts, correct = synthetic
    model = fit_classifier(DifficultyClassifier(C=0.1), prompts, correct)
    expected = model.predict_p_fail(prompts)
    data = DataRef(path="synthetic", sha256="0" * 64, n_rows=len(prompts), train_rows=len(prompts))
    card_path = save_router(model, tmp_path / "old", tiers=["weak", "strong"], data=data, metrics={})
    for name in ("steps", "steps_data", "estimator", "alpha"):
        del model.__dict__[name]  # the model file an older cascade wrote
    sio.dump(model, tmp_path / "old" / MODEL_FILE)
    card = json.loads(card_path.read_text())
    del card["aux_data"]
    card["model_sha256"] = hashlib.sha256((tmp_path / "old" / MODEL_FILE).read_bytes()).hexdigest()
    card_path.write_text(json.dumps(card))
    loaded, card = load_router(tmp_path / "old")
    assert not loaded.steps and loaded.estimator == "logistic" and card.aux_data == []
    assert np.array_equal(loaded.predict_p_fail(prompts), expected)


def test_linear_estimator_gain_is_a_ridge_regression_of_the_gain(synthetic) -> None:
    prompts, correct = synthetic
    model = fit_classifier(DifficultyClassifier(estimator="linear", alpha=50.0), prompts, correct)
    p_fail = model.predict_p_fail(prompts)
    assert np.all((p_fail >= P_MIN) & (p_fail <= 1 - P_MIN))
    Z = model.standardize(model.featurizer().transform(prompts))
    gain = Ridge(alpha=50.0).fit(Z, correct[:, 1].astype(float) - correct[:, 0]).predict(Z)
    inside = np.all((p_fail > P_MIN) & (p_fail < 1 - P_MIN), axis=1)
    assert inside.mean() > 0.9
    assert np.allclose((p_fail[:, 0] - p_fail[:, 1])[inside], gain[inside])
    assert ev.report(p_fail, correct)["apgr"] > 0.6
    with pytest.raises(ValueError, match="estimator must be"):
        fit_classifier(DifficultyClassifier(estimator="forest"), prompts, correct)


def test_cli_trains_a_steps_router_and_refuses_aux_data_without_the_block(tmp_path, steps_jsonl, capsys) -> None:
    prompts, correct = synthetic_outcomes(n=200, seed=1)
    lines = ["prompt,weak,strong"] + [f'"{p}",{w},{s}' for p, (w, s) in zip(prompts, correct, strict=True)]
    csv_path = tmp_path / "outcomes.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    args = ["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--cv-folds", "0"]
    assert main([*args, "--out", str(tmp_path / "r"), "--features", "lexical,steps", "--aux-data",
                 str(steps_jsonl), "--estimator", "linear"]) == 0
    model, card = load_router(tmp_path / "r")
    assert card.feature_spec.steps and card.params["estimator"] == "linear" and card.aux_data[0].n_rows == 300
    assert model.estimator == "linear" and model.steps_model_.data_sha256 == card.aux_data[0].sha256
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "r2"), "--aux-data", str(steps_jsonl)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add one to --features" in err[0]
    assert main([*args, "--out", str(tmp_path / "r3"), "--features", "steps", "--aux-data",
                 str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read the aux data" in capsys.readouterr().err


def test_predicted_steps_track_the_reference_solutions_of_gsm8k_test_questions(gsm8k_train_jsonl) -> None:
    test_path = shared_file("gsm8k", "test.jsonl")
    model = fit_steps_model(gsm8k_train_jsonl)
    rows = [json.loads(line) for line in test_path.read_text().splitlines()[:400]]
    truth = np.array([solution_steps(r["answer"]) for r in rows])
    predicted = _predict_steps(model, [r["question"] for r in rows])
    assert model.n_rows == 7473 and model.cv_r2 > 0.3
    assert np.corrcoef(predicted, truth)[0, 1] > 0.5
