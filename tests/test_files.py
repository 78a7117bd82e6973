"""cascade.files: every way a config-like file can be wrong is one ConfigError naming the file."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from cascade.errors import ConfigError
from cascade.files import decode, load


class Card(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    gpus: int = 1

    def __post_init__(self) -> None:
        if self.gpus > 8:
            raise ConfigError("`gpus` must be at most 8")


@pytest.mark.parametrize(("suffix", "text"), [(".json", '{"name": "a", "gpus": 2}'), (".toml", 'name = "a"\ngpus = 2\n')])
def test_load_reads_json_or_toml_by_the_file_suffix(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"card{suffix}"
    path.write_text(text)
    assert load(path, Card, "card") == Card(name="a", gpus=2)


@pytest.mark.parametrize(("text", "expected"), [
    ('{"name": "a", "colour": 1}', "c.json: invalid card: unknown key `colour`"),
    ('{"gpus": 1}', "c.json: invalid card: missing required key `name`"),
    ('{"name": "a", "gpus": "two"}', "c.json: invalid card: Expected `int`, got `str` in `gpus`"),
    ('{"name": ', "c.json: invalid card: not valid JSON: "),
    ('{"name": "a", "gpus": 9}', "c.json: invalid card: `gpus` must be at most 8"),
])
def test_a_wrong_file_is_one_config_error_naming_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path, Card, "card")
    assert info.value.message.startswith(f"{tmp_path}/") and expected in info.value.message
    assert "\n" not in info.value.message


def test_an_unreadable_file_says_what_could_not_be_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cannot read card .*absent\.toml: No such file"):
        load(tmp_path / "absent.toml", Card, "card")


def test_decode_without_a_what_leads_with_the_source_only() -> None:
    with pytest.raises(ConfigError) as info:
        decode("[[tiers]\n", Card, "cascade.toml", "toml")
    assert info.value.message.startswith("cascade.toml: not valid TOML: ")
