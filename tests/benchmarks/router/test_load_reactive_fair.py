"""benchmarks/router/load_reactive_fair.py on a tiny run (2 seeds, 2 loads, 2-second segments, about a minute): every arm
gets the same arrivals, the best static point is one of the capped ones, and only the reactive arm degrades.
Structure and invariants only, never timings."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cascade.testing.processes import run

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.router.load_reactive_fair"


def _script() -> Any:
    return importlib.import_module(MODULE)


def test_segments_depend_on_seed_and_load_only_and_the_uncapped_arm_gets_time_to_drain() -> None:
    fair = _script()
    capped = fair.segments(2, [1.0, 2.0], 5.0, 4.0, 1.0, drain=False)
    drained = fair.segments(2, [1.0, 2.0], 5.0, 4.0, 1.0, drain=True)
    assert [(s[0], s[1]) for s in capped] == [(0, 1.0), (0, 2.0), (1, 1.0), (1, 2.0)]
    for a, b in zip(capped, drained, strict=True):
        assert [t - a[2] for t in a[3]] == pytest.approx([t - b[2] for t in b[3]])  # the same arrivals
        assert all(a[2] <= t < a[2] + 4.0 for t in a[3])
    assert drained[-1][2] > capped[-1][2]


def test_static_thresholds_send_the_asked_share_to_the_upper_tier() -> None:
    fair = _script()
    ladder = fair.qwen15_ladder()
    assert len(ladder.prompts) > 50 and ladder.accuracy[0] < ladder.accuracy[1]
    for share in (0.25, 0.5, 1.0):
        assert fair.tier_shares(ladder, fair.thresholds(ladder, share))[1] == pytest.approx(share, abs=0.05)
    caps, nominal = fair.capacity(ladder, [(50, 2, 8), (50, 2, 32)], 2.0)
    assert caps == [8, 4] and nominal > 0


def test_on_the_four_tier_ladder_the_sweep_moves_the_direct_1_5b_cut_and_keeps_the_reasoning_tiers() -> None:
    fair = _script()
    ladder = fair.v7_ladder()
    assert [t.branches for t in ladder.tiers] == [1, 1, 1, 8] and ladder.fast is not None
    for share in (0.6, 0.75, 1.0):
        points = fair.thresholds(ladder, share)
        assert points == sorted(points) and points[2] == ladder.balanced[2]  # the reasoning tier's cut stays
        assert sum(fair.tier_shares(ladder, points)[2:]) == pytest.approx(share, abs=0.02)
    assert fair.thresholds(ladder, 1.0)[:2] == [0.0, 0.0]
    caps, _ = fair.capacity(ladder, [(20, 0.5, 32), (50, 1, 16), (50, 2, 8), (50, 2, 32)], 2.0)
    assert caps == [32, 16, 8, 4]
    assert "fast = [0.8" in fair.gateway_toml(ladder, ["http://a"] * 4, [32, 16, 8, 32], ladder.balanced, caps,
                                              "capacity", {})


@pytest.mark.timeout(300)
def test_a_tiny_run_pairs_every_arm_on_the_same_arrivals_and_only_the_reactive_arm_degrades(tmp_path: Path) -> None:
    command = [sys.executable, "-m", MODULE, "--ladders", "qwen15", "--seeds", "2", "--loads", "1,2",
               "--segment-s", "2", "--gap-s", "1", "--qwen15-shares", "0.25",
               "--arms", "static_capped,capped@0.25,reactive", "--out", str(tmp_path / "r.json"),
               "--plot", str(tmp_path / "r.png")]
    done = run(command, timeout_s=280, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    ladder = json.loads(done.stdout)["ladders"]["qwen15"]
    arms = ladder["arms"]
    assert list(arms) == ["static_capped", "capped@0.25", "reactive"]
    counts = {name: [(s["seed"], s["load_x"], s["requests"]) for s in arm["segments"]] for name, arm in arms.items()}
    assert len({tuple(c) for c in counts.values()}) == 1 and len(counts["reactive"]) == 4
    for arm in arms.values():
        for s in arm["segments"]:
            assert 0 <= s["rejected_429"] <= s["failed"] <= s["requests"]
            assert s["correct_goodput_rps"] * 2 <= s["requests"]
    assert arms["static_capped"]["degraded_requests"] == 0 == arms["capped@0.25"]["degraded_requests"]
    for load in ("1x", "2x"):
        entry = ladder["by_load"][load]
        assert entry["static_best"] in ("static_capped", "capped@0.25")
        for versus in entry["reactive_vs"].values():
            assert versus["t95"][0] <= versus["mean_ratio"] <= versus["t95"][1]
            assert versus["bootstrap95"][0] <= versus["bootstrap95"][1]
    assert (tmp_path / "r.png").stat().st_size > 10_000
