"""benchmarks/router/learning_curve.py: its largest point is the router `cascade router train` fits on that
split (checked against the committed RouteLLM router's card), small data scores worse, bad input exits 2."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.router import learning_curve as lc
from cascade.errors import ConfigError
from cascade.router.cli import FEATURE_BLOCKS as CLI_FEATURE_BLOCKS
from cascade.router.train.pipeline import FEATURE_BLOCKS, TrainOptions, classifier_for
from tests.router.conftest import GSM8K_TIERS, synthetic_outcomes

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.router.learning_curve"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", MODULE, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO)


def _synthetic_csv(tmp_path: Path) -> Path:
    """400 synthetic outcomes (tiers weak, strong) in RouteLLM's CSV format."""
    prompts, correct = synthetic_outcomes(n=400, seed=1)
    path = tmp_path / "outcomes.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "weak", "strong"])
        writer.writerows([p, bool(a), bool(b)] for p, (a, b) in zip(prompts, correct, strict=True))
    return path


def test_the_largest_size_on_split_0_is_the_committed_routellm_router(gsm8k_csv, tmp_path: Path) -> None:
    card = json.loads((REPO / "models" / "routers" / "routellm-gsm8k" / "card.json").read_text())
    result = _run("--outcomes", str(gsm8k_csv), "--tiers", ",".join(GSM8K_TIERS), "--features",
                  "lexical,steps,restated", "--repeats", "2", "--sizes", "82,659", "--plot", str(tmp_path / "lc.png"))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["sizes"] == [82, 659] and report["test_rows"] == 660
    assert report["apgr_by_split"][0][-1] == pytest.approx(card["metrics"]["holdout"]["apgr"], abs=1e-3)
    assert report["apgr_mean"][0] < report["apgr_mean"][1]  # 82 rows route worse than 659
    assert report["gain_last_step"]["higher_in"] <= 2
    assert (tmp_path / "lc.png").stat().st_size > 10_000


def test_synthetic_curve_rises_and_default_sizes_end_at_the_training_part(tmp_path: Path) -> None:
    result = _run("--outcomes", str(_synthetic_csv(tmp_path)), "--tiers", "weak,strong", "--repeats", "3")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["sizes"] == [25, 50, 100, 200]
    assert report["gain_per_doubling"]["mean"] > 0


@pytest.mark.parametrize("args, message", [
    (["--train-fraction", "1"], "--train-fraction"),
    (["--repeats", "1"], "--repeats"),
    (["--sizes", "5,100"], "--sizes must lie in 20..200"),
    (["--sizes", "50,201"], "--sizes must lie in 20..200"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = _run("--outcomes", str(_synthetic_csv(tmp_path)), "--tiers", "weak,strong", *args)
    assert result.returncode == 2 and message in result.stderr


def test_gain_per_doubling_is_the_slope_against_log2_rows() -> None:
    sizes = [50, 100, 200, 400]
    apgrs = np.array([[0.5, 0.53, 0.56, 0.59], [0.6, 0.6, 0.6, 0.6]])
    assert lc.per_doubling(sizes, apgrs) == pytest.approx([0.03, 0.0])


def test_feature_blocks_are_named_alike_on_the_cli_and_in_the_classifier() -> None:
    assert CLI_FEATURE_BLOCKS == FEATURE_BLOCKS
    model = classifier_for(TrainOptions(features=("steps", "restated"), aux_data="x.jsonl"))
    assert (model.lexical, model.steps, model.restated_number, model.steps_data) == (False, True, True, "x.jsonl")
    with pytest.raises(ConfigError, match="feature blocks are"):
        classifier_for(TrainOptions(features=("lexical", "ngrams")))
