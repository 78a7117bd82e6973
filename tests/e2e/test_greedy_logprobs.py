"""benchmarks/router/greedy_logprobs.py with the real SmolLM2 weights: it re-answers labelled rows greedily, records the
chosen tokens' confidence on every answer, keeps the other tiers' outcomes, and resumes without redoing a row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.data.outcomes import read_rows

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.router.greedy_logprobs"
LABELLED = ROOT / "models" / "outcomes" / "gsm8k-train-embedded-v6.jsonl"


def test_answers_carry_token_confidence_and_a_second_run_resumes(tmp_path) -> None:
    source = tmp_path / "labelled.jsonl"
    source.write_text("".join(LABELLED.read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", MODULE, str(source), "--tier", "smollm2-135m", "--out", str(out), "--batch", "2"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=500, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["rows_written"] == summary["rows_with_a_served_answer"] == 2 and summary["this_run"]["tokens"] > 0
    before = {r.id: r for _, r in read_rows(source)}
    for _, row in read_rows(out):
        redone = row.tiers["smollm2-135m"]
        conf = redone.token_confidence
        assert conf is not None and conf.tokens == redone.output_tokens > 0
        assert 0 < conf.lowest_group <= 1 and 0 < conf.mean <= 1 and 0 < conf.tail <= 1
        assert redone.finish_reason in ("stop", "length") and redone.correct is not None
        assert row.tiers["qwen2.5-coder-0.5b"] == before[row.id].tiers["qwen2.5-coder-0.5b"]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["this_run"]["tokens"] == 0 and len(read_rows(out)) == 2


def test_an_unknown_tier_is_one_line_and_exit_2(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", MODULE, str(LABELLED), "--tier", "nope", "--out",
                           str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "unknown tier 'nope'" in done.stderr
