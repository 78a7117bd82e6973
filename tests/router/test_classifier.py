"""The difficulty classifier: sklearn conventions, calibrated per-tier p_fail, fast numpy prediction."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sklearn.base import clone

from cascade.errors import ConfigError
from cascade.router import evaluate as ev
from cascade.router.classifier import DifficultyClassifier
from cascade.router.features import FeatureSpec, Featurizer
from cascade.router.lexical import LEXICAL_NAMES, lexical_features
from cascade.router.operating import NEVER, chosen_tiers, route_score
from cascade.router.outcomes import load_outcomes, split_indices
from cascade.router.train import fit_classifier, fit_classifier_features
from tests.router.conftest import GSM8K_TIERS


def test_fit_classifier_returns_the_model_and_sets_trailing_underscore_attributes(synthetic) -> None:
    prompts, correct = synthetic
    model = DifficultyClassifier(C=0.1)
    assert fit_classifier(model, prompts, correct) is model
    assert model.coef_.shape == (2, len(LEXICAL_NAMES)) and model.n_tiers_ == 2
    assert clone(model).get_params() == model.get_params()
    assert not hasattr(clone(model), "coef_")


def test_p_fail_is_a_probability_per_tier_and_harder_prompts_score_higher(synthetic) -> None:
    prompts, correct = synthetic
    model = fit_classifier(DifficultyClassifier(), prompts, correct)
    p_fail = model.predict_p_fail(prompts)
    assert p_fail.shape == (len(prompts), 2) and np.all((p_fail > 0) & (p_fail < 1))
    easy = "Sam buys 3 apples for $2 each. How much does he pay in total?"
    hard = ". ".join([f"Sam buys {k} apples for $4 each" for k in range(11, 17)]) + ". How much does he pay in total?"
    assert model.predict_p_fail([hard])[0, 0] > model.predict_p_fail([easy])[0, 0]
    assert ev.report(p_fail, correct)["apgr"] > 0.6


def test_one_standard_error_rule_never_picks_a_weaker_shrinkage(synthetic) -> None:
    prompts, correct = synthetic
    best = fit_classifier(DifficultyClassifier(Cs=(0.001, 0.01, 0.1, 1.0)), prompts, correct)
    one_se = fit_classifier(DifficultyClassifier(Cs=(0.001, 0.01, 0.1, 1.0), selection="log_loss_1se"), prompts, correct)
    assert np.all(one_se.C_ <= best.C_)
    with pytest.raises(ValueError, match="selection must be"):
        fit_classifier(DifficultyClassifier(selection="auc"), prompts, correct)


def test_fit_on_precomputed_features_equals_fit_on_prompts(synthetic) -> None:
    prompts, correct = synthetic
    model = DifficultyClassifier(C=0.1)
    X = model.featurizer().transform(prompts)
    a = fit_classifier(clone(model), prompts, correct).predict_p_fail(prompts)
    b = fit_classifier_features(clone(model), X, correct).predict_p_fail_features(X)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="columns"):
        fit_classifier_features(clone(model), X[:, :5], correct)


def test_a_tier_that_never_fails_gets_a_constant_smoothed_p_fail(synthetic) -> None:
    prompts, correct = synthetic
    correct = correct.copy()
    correct[:, 1] = True
    p_fail = fit_classifier(DifficultyClassifier(C=0.1), prompts, correct).predict_p_fail(prompts[:5])
    assert np.allclose(p_fail[:, 1], 1 / (len(prompts) + 2))


def test_fit_is_deterministic_for_a_seed(synthetic) -> None:
    prompts, correct = synthetic
    a = fit_classifier(DifficultyClassifier(Cs=(0.01, 0.1), random_state=3), prompts, correct).predict_p_fail(prompts)
    b = fit_classifier(DifficultyClassifier(Cs=(0.01, 0.1), random_state=3), prompts, correct).predict_p_fail(prompts)
    assert np.array_equal(a, b)


def test_low_expected_gain_stays_on_the_cheapest_tier() -> None:
    # As the gateway routes p_fail: by its route score, one band of it per tier.
    thresholds = np.array([0.6, 0.8])
    p_fail = np.array([[0.05, 0.04, 0.01], [0.6, 0.3, 0.2], [0.9, 0.8, 0.1]])  # expected gain 0.04, 0.4, 0.8
    assert chosen_tiers(route_score(p_fail), thresholds).tolist() == [0, 1, 2]
    assert chosen_tiers(route_score(p_fail), np.array([NEVER, NEVER])).tolist() == [0, 0, 0]


def test_lexical_features_are_deterministic_and_fast() -> None:
    prompt = ("Janet has 16 eggs. She eats 3 and bakes with 4 more than twice that. She sells the rest "
              "for $2.50 each. How much money, in dollars, does she make every day?")
    row = lexical_features(prompt)
    assert len(row) == len(LEXICAL_NAMES) and row == lexical_features(prompt)
    timings = []
    for _ in range(200):
        start = time.perf_counter()
        lexical_features(prompt)
        timings.append(time.perf_counter() - start)
    assert np.median(timings) < 1e-3


def test_feature_spec_rejects_unknown_embeddings_and_empty_specs() -> None:
    with pytest.raises(ConfigError, match="unknown embeddings"):
        Featurizer(FeatureSpec(embeddings="word2vec"))
    with pytest.raises(ConfigError, match="no features"):
        Featurizer(FeatureSpec(lexical=False))


def test_hashed_ngrams_block_is_normalised_and_stateless() -> None:
    featurizer = Featurizer(FeatureSpec(lexical=False, hash_features=64))
    X = featurizer.transform(["two apples and two pears", "a question?"])
    assert X.shape == (2, 64) and np.allclose(np.linalg.norm(X, axis=1), 1.0)
    assert not featurizer.standardize_mask.any()


def test_training_on_half_of_gsm8k_beats_random_on_the_other_half(gsm8k_csv) -> None:
    outcomes = load_outcomes(gsm8k_csv, GSM8K_TIERS)
    train, test = (outcomes.subset(rows) for rows in split_indices(len(outcomes), 0.5, 0))
    model = fit_classifier(DifficultyClassifier(C=0.003), train.prompts, train.correct)
    report = ev.report(model.predict_p_fail(test.prompts), test.correct)
    assert report["apgr"] > 0.6 and report["auc"] > 0.55 and report["ece"] < 0.08


def test_a_prompt_unlike_any_training_prompt_gets_a_finite_probability(synthetic) -> None:
    """Features constant in training (std of float noise) must not blow up an unseen prompt's score."""
    prompts, correct = synthetic
    model = fit_classifier(DifficultyClassifier(), prompts, correct)
    odd = ["Write a haiku about the sea.", "A) 1\nB) 2\nC) 3\nD) 4\nWhich is prime? " * 20, "x" * 5000, ""]
    p_fail = model.predict_p_fail(odd)  # pytest turns an overflow warning into a failure
    assert np.all(np.isfinite(p_fail)) and np.all((p_fail >= 0) & (p_fail <= 1))
    assert np.all(model.scale_ > 1e-6)  # no division by the float noise of a constant feature
