"""The conversion of measured H200 step times into cascade profiles (cascade/testing/fakes/gpu_profiles.py)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from cascade.optimizer.profile import load_profile
from cascade.testing.fakes.gpu_profiles import convert, kv_capacity_tokens, main, mem_fraction_static
from tests.shared_data import shared_file

COMMITTED = Path(__file__).resolve().parents[3] / "models" / "gpu" / "profiles" / "h200"


def _readme_table() -> dict[str, list[float]]:
    """The README's fit table: shape -> [fixed ms, per sequence us, per context token ns, prefill ms, prefill us/token]."""
    rows = {}
    for line in shared_file("gpu", "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"[\d.]+", cells[1]):
            prefill = re.match(r"([\d.]+) \+ ([\d.]+)", cells[5])
            assert prefill is not None, line
            rows[cells[0]] = [float(cells[1]), float(cells[2]), float(cells[3]),
                              float(prefill.group(1)), float(prefill.group(2))]
    return rows


def test_fits_match_the_readme_table_within_rounding() -> None:
    fits = convert(shared_file("gpu", "h200-steps.json"), shared_file("gpu", "shapes.json"))
    table = _readme_table()
    assert len(table) >= 7
    for shape, (fixed_ms, seq_us, ctx_ns, prefill_ms, prefill_us) in table.items():
        d, p = fits[shape].profile.decode, fits[shape].profile.prefill
        assert d.fixed_s * 1e3 == pytest.approx(fixed_ms, abs=0.006), shape
        assert d.per_sequence_s * 1e6 == pytest.approx(seq_us, abs=0.06), shape
        assert d.per_context_token_s * 1e9 == pytest.approx(ctx_ns, abs=0.06), shape
        assert p.fixed_s * 1e3 == pytest.approx(prefill_ms, abs=0.06), shape
        assert p.per_token_s * 1e6 == pytest.approx(prefill_us, abs=0.06), shape
        # The README: "max relative error 5-14 %".
        assert 0.045 <= fits[shape].max_decode_error <= 0.145, shape


def test_committed_profiles_are_what_the_command_writes(tmp_path: Path) -> None:
    assert main(["--steps", str(shared_file("gpu", "h200-steps.json")), "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written == sorted(p.name for p in COMMITTED.glob("*.json"))
    for name in written:
        fresh, committed = load_profile(tmp_path / name), load_profile(COMMITTED / name)
        for part in ("decode", "prefill"):  # least squares may differ in the last bits from one BLAS to another
            assert msgspec.to_builtins(getattr(fresh, part)) == pytest.approx(
                msgspec.to_builtins(getattr(committed, part)), rel=1e-9), name
        assert msgspec.structs.replace(fresh, decode=committed.decode, prefill=committed.prefill) == committed, name


def test_kv_cache_is_the_memory_sglang_leaves_after_the_weights() -> None:
    shape = {"num_hidden_layers": 28, "num_key_value_heads": 4, "head_dim": 128}
    fraction = mem_fraction_static(141e9 / 2**20)
    assert 0.85 < fraction < 0.95  # a 141 GB GPU keeps SGLang's 10 GiB floor or more for activations and graphs
    small = kv_capacity_tokens(shape, 15e9, 141e9)
    large = kv_capacity_tokens(shape, 30e9, 141e9)
    per_token = 28 * 4 * 128 * 2 * 2
    assert small - large == pytest.approx(15e9 / per_token, rel=1e-4)  # every weight byte is a KV byte less
    with pytest.raises(ValueError, match="no KV cache"):
        kv_capacity_tokens(shape, 140e9, 141e9)


def test_a_missing_steps_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--steps", str(tmp_path / "none.json"), "--out", str(tmp_path)]) == 2
    assert "none.json" in capsys.readouterr().err
