"""benchmarks/router/null_card.py: the options it rebuilds from a card train the router the card describes, and the
block it wrote into the shipped card agrees with the card's own operating points."""

from __future__ import annotations

import msgspec
import pytest

from benchmarks.router.null_card import options_from_card
from cascade.repo_paths import REPO_ROOT
from cascade.router.artifact import read_card
from cascade.router.train.null import NullReport
from cascade.router.train.pipeline import classifier_for

ROUTERS = ["embedded-gsm8k", "embedded-gsm8k-v7"]


@pytest.mark.parametrize("name", ROUTERS)
def test_the_rebuilt_options_make_the_cards_classifier(name: str) -> None:
    assert REPO_ROOT is not None
    card = read_card(REPO_ROOT / "models" / "routers" / name)
    model = classifier_for(options_from_card(card, cv_folds=5))
    assert model.spec == card.feature_spec
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in model.get_params().items()}
    saved = {"hidden_states": None, **card.params}  # a parameter added after the card was written: its default
    assert all(saved[k] == v for k, v in params.items()), name


def test_the_shipped_cards_null_block_agrees_with_its_operating_points() -> None:
    assert REPO_ROOT is not None
    card = read_card(REPO_ROOT / "models" / "routers" / "embedded-gsm8k")
    report = msgspec.convert(card.metrics["cross_validated"]["random_null"], NullReport)
    assert report.draws >= 100 and report.token_reference == card.tiers[-1]
    rows = {row["name"]: row for row in card.metrics["cross_validated"]["operating_points"]}
    top = rows[f"all {card.tiers[-1]}"]["decode_tokens"]
    for point in report.points:  # in sample, the router's thresholds are the card's calibration
        assert point.in_sample.router.accuracy == rows[point.name]["accuracy"]
        assert point.in_sample.router.token_share == pytest.approx(rows[point.name]["decode_tokens"] / top, abs=1e-4)
