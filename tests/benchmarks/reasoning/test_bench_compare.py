"""benchmarks/reasoning/bench_compare.py: paired accuracy differences and latency/token ratios between bench runs, on the
questions every run answered, the last record of a resumed run counting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.reasoning.bench_compare"


def _record(qid: str, correct: bool, latency: float, tokens: int, error: str | None = None,
            machine: str = "cpu A; 2 cores; avx512f") -> dict:
    return {"id": qid, "correct": correct, "latency_s": latency, "queue_s": 0.0, "decode_tokens": tokens,
            "error": error, "method": "m", "key": "k", "machine": machine}


def _write(path: Path, records: list[dict], torn_tail: bool = False) -> Path:
    path.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in records)
    (path / "requests.jsonl").write_text(text + ('{"id": "q9", "corr' if torn_tail else ""))
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", MODULE, *args, "--resamples", "2000"], capture_output=True,
                          text=True, timeout=60, check=False, cwd=ROOT)


def test_pairs_on_common_questions_with_the_last_record_counting(tmp_path: Path) -> None:
    # Run A: right on 8 of 10, half the latency and tokens of B; q0 first failed, then was resumed and answered.
    a = [_record("q0", False, 1.0, 10, error="timeout")]
    a += [_record(f"q{i}", i < 8, 10.0, 100) for i in range(10)]
    b = [_record(f"q{i}", i < 5, 20.0, 200) for i in range(10)]
    # C never answered q3: the comparison drops it for every run.
    c = [_record(f"q{i}", False, 5.0, 50) for i in range(10) if i != 3]
    dirs = [_write(tmp_path / n, recs, torn_tail=(n == "a")) for n, recs in (("a", a), ("b", b), ("c", c))]
    out = tmp_path / "cmp.json"
    proc = _run("--run", f"a={dirs[0]}", "--run", f"b={dirs[1]}", "--run", f"c={dirs[2] / 'requests.jsonl'}",
                "--json-out", str(out), "--plot", str(tmp_path / "cmp.png"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result == json.loads(proc.stdout)
    assert (tmp_path / "cmp.png").stat().st_size > 0
    assert result["questions"] == 9 and result["left_out"] == ["q3"]
    assert result["runs"]["a"]["accuracy"] == round(7 / 9, 4)  # q0 counts as answered (its last record)
    assert result["runs"]["b"]["accuracy"] == round(4 / 9, 4)
    ab = result["pairs"]["a vs b"]
    assert ab["accuracy_diff"] == round(3 / 9, 4) and ab["wins"] == 3 and ab["losses"] == 0
    assert ab["latency_mean_ratio"] == 0.5 and ab["decode_tokens_ratio"] == 0.5
    assert ab["latency_mean_ratio_ci95"] == [0.5, 0.5]  # constant columns: no spread
    low, high = ab["accuracy_diff_ci95"]
    assert 0 <= low <= 3 / 9 <= high <= 1
    assert set(result["pairs"]) == {"a vs b", "a vs c", "b vs c"}
    assert "latency_warning" not in result and "latency" not in proc.stderr


def test_runs_on_different_machines_carry_a_latency_warning(tmp_path: Path) -> None:
    """A run resumed on another CPU (or records from before the field) mixes latencies that do not compare."""
    a = [_record(f"q{i}", True, 10.0, 100) for i in range(6)]
    b = [_record(f"q{i}", True, 30.0, 100, machine="cpu B; 2 cores; amx_bf16,avx512f" if i < 3 else "")
         for i in range(6)]
    proc = _run("--run", f"a={_write(tmp_path / 'a', a)}", "--run", f"b={_write(tmp_path / 'b', b)}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["runs"]["a"]["machines"] == ["cpu A; 2 cores; avx512f"]
    assert result["runs"]["b"]["machines"] == ["cpu B; 2 cores; amx_bf16,avx512f", "unrecorded"]
    assert "3 machines" in result["latency_warning"] and "not comparable" in proc.stderr


def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    proc = _run("--run", "a=" + str(tmp_path / "missing"), "--run", "b=" + str(tmp_path))
    assert proc.returncode != 0 and "no requests.jsonl" in proc.stderr
    proc = _run("--run", "only=" + str(tmp_path))
    assert proc.returncode == 2 and "two or more" in proc.stderr
    proc = _run("--run", "noequals")
    assert proc.returncode == 2 and "NAME=PATH" in proc.stderr
