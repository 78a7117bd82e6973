"""benchmarks/frontdoor/prompt_count.py end to end on a few GSM8K questions: every model prepared here measured for
cost, ratio and the loop's share, a counted reservation never below the count and far below the byte bound.
Structure and bounds only: the numbers are the script's to report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cascade.engines.models import all_cards, is_prepared
from cascade.testing.processes import run
from tests.shared_data import shared_file

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.frontdoor.prompt_count"
pytestmark = pytest.mark.skipif(not any(is_prepared(c) for c in all_cards()),
                                reason="no embedded model is prepared (`cascade models prepare`)")


@pytest.mark.timeout(120)
def test_a_short_run_reports_cost_ratio_and_loop_share_per_model() -> None:
    shared_file("gsm8k", "test.jsonl")
    done = run([sys.executable, "-m", MODULE, "--n", "30", "--rounds", "1", "--loop-n", "5"], timeout_s=100, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert result["config"]["data"] == "../shared/data/gsm8k/test.jsonl" and result["config"]["gsm8k"] == 30
    for name in result["config"]["models"]:
        ratio = result["ratio"][name]
        assert 1.0 < ratio["counted"]["min"] <= ratio["counted"]["max"] < ratio["byte_bound"]["min"]
        assert result["ratio"]["ladder"][name]["min"] > 1.0
        for text in ("gsm8k", "digits"):
            assert result["cost"][name][text]["count_us_per_byte"] > result["cost"][name][text]["bound_us_per_byte"]
        assert set(result["cap"][name]) == {"english_ms", "digits_ms"}
    (loop,) = result["loop"].values()
    assert set(loop) == {"64", "256", "1024", "4096"} and all(set(row) == {"inline", "thread"} for row in loop.values())
