"""benchmarks/planner/plan_widths.py on the small planning problem: every arm plans the same cluster, the planned arm
reports the widths it chose, and its ratios against the fixed arms are read from the runs it printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.optimizer.conftest import SMALL_PROBLEM

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.planner.plan_widths"


def test_planned_and_fixed_widths_plan_the_same_gpus_and_the_ratios_match_the_runs(tmp_path) -> None:
    spec = tmp_path / "problem.toml"
    spec.write_text(SMALL_PROBLEM.format(mode="cascade").replace('metric = "correct"', 'metric = "score"'))
    done = subprocess.run([sys.executable, "-m", MODULE, "--spec", str(spec), "--targets", "0.75,0.8",
                           "--widths", "1,1:3,2", "--fixed", "3,2", "--plot", str(tmp_path / "w.png")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    runs = {(r["target"], r["arm"]): r for r in out["runs"]}
    assert set(runs) == {(t, a) for t in (0.75, 0.8) for a in ("fixed-1", "fixed-3,2", "planned")}
    for (_, arm), run in runs.items():
        assert sum(run["gpus"].values()) == 8
        assert run["latency_envelope_s"] <= run["latency_s"]
        if arm == "fixed-3,2":
            assert all(w == [3, 2] for w in run["widths"].values())
        if arm == "planned":
            assert all(w in ([1, 1], [3, 2]) for w in run["widths"].values()) and run["plans_tried"] >= 2
    assert runs[(0.8, "fixed-3,2")]["tokens_per_request"] > runs[(0.8, "fixed-1")]["tokens_per_request"]
    ratio = out["ratios"]["0.8"]["latency_s_vs_fixed-1"]
    assert ratio == round(runs[(0.8, "planned")]["latency_s"] / runs[(0.8, "fixed-1")]["latency_s"], 3)
    assert (tmp_path / "w.png").stat().st_size > 0


def test_a_bad_width_list_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", MODULE, "--widths", "1;1"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--widths" in done.stderr


def test_branched_tiers_keep_the_other_tiers_at_one_branch(tmp_path) -> None:
    spec = tmp_path / "problem.toml"
    spec.write_text(SMALL_PROBLEM.format(mode="cascade").replace('metric = "correct"', 'metric = "score"'))
    done = subprocess.run([sys.executable, "-m", MODULE, "--spec", str(spec), "--targets", "0.75,0.999", "--widths",
                           "1,1:3,2", "--fixed", "3,2", "--branched-tiers", "small"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["branched_tiers"] == ["small"]
    widths = {r["arm"]: r["widths"] for r in out["runs"] if r["target"] == 0.75}
    # No arm meets 0.999: each is reported with its quality, no envelope, and no ratio against it.
    unreachable = [r for r in out["runs"] if r["target"] == 0.999]
    assert unreachable and all(not r["meets_target"] and r["latency_envelope_s"] is None for r in unreachable)
    assert out["ratios"]["0.999"]["latency_envelope_s_vs_fixed-1"] is None
    assert widths["fixed-3,2"] == {"small": [3, 2], "large": [1, 1]}
    assert widths["planned"]["large"] == [1, 1] and widths["planned"]["small"] in ([1, 1], [3, 2])


def test_an_unknown_branched_tier_is_one_line_and_exit_2(tmp_path) -> None:
    spec = tmp_path / "problem.toml"
    spec.write_text(SMALL_PROBLEM.format(mode="route"))
    done = subprocess.run([sys.executable, "-m", MODULE, "--spec", str(spec), "--branched-tiers", "huge"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no tier huge" in done.stderr


def test_on_the_embedded_branches_the_planner_takes_the_narrowest_width_that_meets_the_target() -> None:
    # Recorded branches (models/outcomes/gsm8k-train-embedded-branches.md): one sampled branch 0.21, a vote of 3
    # of 3 0.25, the default 4 branches stopping at 2: 0.19.
    spec = ROOT / "examples" / "problem-embedded-reason-widths.toml"
    done = subprocess.run([sys.executable, "-m", MODULE, "--spec", str(spec), "--targets", "0.25", "--widths",
                           "1,1:3,3:8,8", "--fixed", "4,2"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    runs = {r["arm"]: r for r in json.loads(done.stdout)["runs"]}
    assert runs["planned"]["widths"] == {"qwen2.5-coder-0.5b-reason": [3, 3]} and runs["planned"]["meets_target"]
    assert not runs["fixed-1"]["meets_target"] and not runs["fixed-4,2"]["meets_target"]
