"""Router artifacts: round trip with a card; loading refuses tampering, version or spec mismatch, and untrusted types."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cascade.errors import ConfigError
from cascade.router.artifact import CARD_FILE, MODEL_FILE, DataRef, load_router, save_router
from cascade.router.classifier import DifficultyClassifier
from cascade.router.train import fit_classifier


@pytest.fixture
def saved(tmp_path, synthetic):
    prompts, correct = synthetic
    model = fit_classifier(DifficultyClassifier(C=0.1, random_state=7), prompts, correct)
    data = DataRef(path="synthetic", sha256="0" * 64, n_rows=len(prompts), train_rows=len(prompts))
    save_router(model, tmp_path / "router", tiers=["weak", "strong"], data=data, metrics={"holdout": {"apgr": 0.7}})
    return tmp_path / "router", model, prompts


def _edit_card(router_dir, edit) -> None:
    path = router_dir / CARD_FILE
    card = json.loads(path.read_text())
    edit(card)
    path.write_text(json.dumps(card))


def test_round_trip_predicts_the_same_and_card_names_its_inputs(saved) -> None:
    router_dir, model, prompts = saved
    loaded, card = load_router(router_dir)
    assert np.array_equal(loaded.predict_p_fail(prompts), model.predict_p_fail(prompts))
    assert card.tiers == ["weak", "strong"] and card.seed == 7
    assert {"cascade", "sklearn", "numpy", "skops"} <= set(card.versions)
    assert card.feature_spec == model.spec and card.metrics["holdout"]["apgr"] == 0.7
    assert card.params["C_chosen"] == [0.1, 0.1]


def test_a_changed_model_file_is_refused(saved) -> None:
    router_dir, _, _ = saved
    with (router_dir / MODEL_FILE).open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ConfigError, match=r"does not match the sha256 in its card"):
        load_router(router_dir)


def test_a_card_with_another_sklearn_version_is_refused(saved) -> None:
    router_dir, _, _ = saved
    _edit_card(router_dir, lambda card: card["versions"].update(sklearn="0.24.2"))
    with pytest.raises(ConfigError, match=r"trained with sklearn 0.24.2 but .* is installed; retrain"):
        load_router(router_dir)


def test_a_card_with_another_feature_spec_is_refused(saved) -> None:
    router_dir, _, _ = saved
    _edit_card(router_dir, lambda card: card["feature_spec"].update(hash_features=64))
    with pytest.raises(ConfigError, match=r"does not match its card"):
        load_router(router_dir)
    _edit_card(router_dir, lambda card: card["feature_spec"].update(version=99))
    with pytest.raises(ConfigError, match=r"feature spec version 99"):
        load_router(router_dir)


def test_a_card_with_unknown_fields_is_refused(saved) -> None:
    router_dir, _, _ = saved
    _edit_card(router_dir, lambda card: card.update(extra=1))
    with pytest.raises(ConfigError, match=r"card\.json: invalid router card: unknown key `extra`"):
        load_router(router_dir)


class Payload:
    """Stands for any class outside the allowlist (skops would have to import and build it)."""


def _replace_model(router_dir, obj) -> None:
    import hashlib

    import skops.io as sio

    sio.dump(obj, router_dir / MODEL_FILE)
    digest = hashlib.sha256((router_dir / MODEL_FILE).read_bytes()).hexdigest()
    _edit_card(router_dir, lambda card: card.update(model_sha256=digest))


def test_a_model_file_with_untrusted_types_is_refused(saved) -> None:
    router_dir, _, _ = saved
    _replace_model(router_dir, Payload())
    with pytest.raises(ConfigError, match=r"outside the allowlist: tests.router.test_artifact.Payload"):
        load_router(router_dir)


def test_a_model_file_holding_another_estimator_is_refused(saved) -> None:
    from sklearn.linear_model import LogisticRegression

    router_dir, _, _ = saved
    _replace_model(router_dir, LogisticRegression())
    with pytest.raises(ConfigError, match=r"holds a LogisticRegression, not a DifficultyClassifier"):
        load_router(router_dir)


def test_a_missing_router_directory_says_what_it_expected(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"card.json not found"):
        load_router(tmp_path)


def test_cards_with_and_without_the_random_null_load(saved) -> None:
    """Cards written before the null (the shipped v7 router's) load as they are; a card carrying it (what `cascade
    router train` writes now) decodes it into the null's report."""
    import msgspec

    from cascade.repo_paths import REPO_ROOT
    from cascade.router.artifact import read_card
    from cascade.router.train.null import NullReport

    assert REPO_ROOT is not None
    older = read_card(REPO_ROOT / "models" / "routers" / "embedded-gsm8k-v7")
    assert "random_null" not in older.metrics["cross_validated"] and older.calibration is not None
    router_dir, _, _ = saved
    report = {"draws": 100, "seed": 0, "folds": 5, "resamples": 1000, "token_reference": None, "points": []}
    _edit_card(router_dir, lambda card: card["metrics"].update(cross_validated={"random_null": report}))
    _, card = load_router(router_dir)
    assert msgspec.convert(card.metrics["cross_validated"]["random_null"], NullReport).draws == 100
