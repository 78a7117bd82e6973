"""benchmarks/reasoning/wave_branches.py: a live adaptive label run's branches, from its waves and branch logprobs.
The committed rows are what the script makes from the committed inputs, and their votes give the recorded rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.reasoning.wave_branches import branches_of, main
from cascade.data.outcomes import TierOutcome

ROOT = Path(__file__).resolve().parents[3]
LABEL = ROOT / "models" / "outcomes" / "qwen15-train-label"
TIER = "qwen2.5-coder-1.5b-reason"


def test_the_committed_branch_rows_come_from_the_label_runs_records(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.jsonl"
    assert main(["--outcomes", str(LABEL.parent / "gsm8k-train-embedded-reason-adaptive.jsonl"), "--tier", TIER,
                 "--waves", str(LABEL / "reason-adaptive-waves.jsonl"),
                 "--logprobs", str(LABEL / "reason-adaptive-logprobs.jsonl.gz"), "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["rows"], result["with_branches"], result["vote_matches_record"]) == (385, 280, 279)
    assert out.read_bytes() == (LABEL / "reason-adaptive-branch-outcomes.jsonl").read_bytes()


def test_an_agreeing_first_wave_is_the_chosen_branch_and_the_rest_of_the_tokens() -> None:
    outcome = TierOutcome(correct=True, answer="7", output_tokens=200, decode_tokens=450)
    branches = branches_of(outcome, 2, {}, 512)
    assert branches is not None
    assert [(b.answer, b.correct, b.output_tokens) for b in branches] == [("7", True, 200), ("7", True, 250)]
    assert branches_of(outcome, 8, {}, 512) is None  # a second wave whose branches were not all scored: no rows
    assert branches_of(outcome, 0, {}, 512) is None  # no waves recorded
