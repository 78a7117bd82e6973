"""benchmarks/router/merge_outcomes.py: tiers labelled in separate runs joined by id into one row per prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.router.merge_outcomes"


def _write(path: Path, rows: list[tuple[str, dict[str, bool]]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "dataset": "gsm8k-train", "tiers": {
        t: {"correct": c, "output_tokens": 10} for t, c in tiers.items()}}) + "\n" for i, tiers in rows))
    return path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", MODULE, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_rows_with_every_taken_tier_in_the_first_files_order(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.jsonl", [("gsm8k-train:2", {"small": True, "other": False}),
                                          ("gsm8k-train:1", {"small": False, "other": True}),
                                          ("gsm8k-train:3", {"small": True})])
    second = _write(tmp_path / "b.jsonl", [("gsm8k-train:1", {"big": True}), ("gsm8k-train:2", {"big": False}),
                                           ("gsm8k-train:9", {"big": True})])
    out = tmp_path / "m.jsonl"
    done = _run("--take", f"{first}:small", "--take", str(second), "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["gsm8k-train:2", "gsm8k-train:1"]  # :3 lacks big, :9 lacks small
    assert all(list(r["tiers"]) == ["small", "big"] for r in rows)  # `other` was not taken
    assert json.loads(done.stdout)["accuracy"] == {"small": 0.5, "big": 0.5}


def test_a_tier_taken_twice_or_absent_is_one_line_and_exit_2(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", [("gsm8k-train:1", {"small": True})])
    twice = _run("--take", str(a), "--take", str(a), "--out", str(tmp_path / "m.jsonl"))
    assert twice.returncode == 2 and "taken twice" in twice.stderr
    absent = _run("--take", f"{a}:nope", "--out", str(tmp_path / "m.jsonl"))
    assert absent.returncode == 2 and "no row has tier 'nope'" in absent.stderr
