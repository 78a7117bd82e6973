"""The hidden block's spec without the model: an unknown view is refused, a card written before the block existed
reads as no hidden block, the block's columns are dense (standardised) ones, and `--features hidden` without the
model's wheel is one line and exit 2. The states themselves: tests/e2e/test_hidden_states_e2e.py."""

from __future__ import annotations

import msgspec
import pytest

from cascade.errors import ConfigError
from cascade.router.features import LEXICAL_NAMES, FeatureSpec
from cascade.router.hidden import HIDDEN_STATES
from cascade.router.train.pipeline import HIDDEN_VIEW


def test_an_unknown_view_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown hidden_states 'gpt-9'"):
        FeatureSpec(hidden_states="gpt-9").validate()


def test_a_spec_saved_before_the_block_reads_as_none_and_the_columns_are_dense() -> None:
    old = msgspec.json.decode(b'{"version": 1, "lexical": true, "steps": true}', type=FeatureSpec)
    assert old.hidden_states is None and old.hidden_dims == 0
    spec = FeatureSpec(hidden_states=HIDDEN_VIEW).validate()
    assert spec.dense_columns == len(LEXICAL_NAMES) + HIDDEN_STATES[HIDDEN_VIEW].dims


def test_training_with_the_block_but_without_the_model_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    from cascade.cli import main
    from cascade.router import hidden

    monkeypatch.setattr(hidden, "hidden_available", lambda name: False)
    (tmp_path / "o.csv").write_text("prompt,a,b\n" + "".join(f"q{i},true,false\n" for i in range(12)))
    code = main(["router", "train", "--outcomes", str(tmp_path / "o.csv"), "--tiers", "a,b", "--out",
                 str(tmp_path / "r"), "--features", "hidden"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--features hidden" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()
