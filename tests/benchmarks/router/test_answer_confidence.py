"""benchmarks/router/answer_confidence.py on outcomes that `cascade label --logprobs` wrote against the fake engine: the
small tier is unsure (low token logprobs) on most of the prompts it gets wrong, so accepting by its confidence
recovers most of the gap to the big tier, and the calibration it prints reads confidence the right way round."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from cascade.cli import main
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.router.answer_confidence"
RIGHT = "So_the_answer_is_18.|####_18"
WRONG = "So_the_answer_is_19.|####_19"
N = 40


def two_tier_toml(url: str) -> str:
    return "".join(f"""
[[tiers]]
name = "{name}"
default_max_tokens = 64
backends = [{{ kind = "openai", url = "{url}", model = "{model}" }}]
""" for name, model in (("small", "fake-small"), ("big", "fake-big")))


def questions() -> list[dict[str, str]]:
    """Rows 0-7: small wrong (0-6 unsure, 7 sure); 8-10: small right but unsure; 11-12: big wrong (and unsure);
    every other answer right and sure. Logprobs seeded."""
    rng = random.Random(0)
    rows = []
    for i in range(N):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        text = f"Q{i}: Tom has {a} apples and buys {b} more, then gives some away. How many are left?"
        directives = [f"[fake answer={RIGHT}]", f"[fake logprob={-rng.uniform(0.02, 0.3):.3f}]"]
        if i < 8:
            directives.append(f"[fake@fake-small answer={WRONG}]")
        if i < 7 or 8 <= i <= 10:
            directives.append(f"[fake@fake-small logprob={-rng.uniform(1.2, 3.0):.3f}]")
        if i in (11, 12):
            directives += [f"[fake@fake-big answer={WRONG}]", f"[fake@fake-big logprob={-rng.uniform(1.5, 3):.3f}]"]
        rows.append({"id": f"q{i}", "prompt": f"{text} {' '.join(directives)}", "reference": "#### 18"})
    return rows


def test_confidence_beats_the_constructed_gap_and_prints_a_calibration(tmp_path: Path) -> None:
    out = tmp_path / "outcomes.jsonl"
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in questions()))
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        (tmp_path / "cascade.toml").write_text(two_tier_toml(url))
        assert main(["label", "--config", str(tmp_path / "cascade.toml"), "--dataset", str(tmp_path / "q.jsonl"),
                     "--out", str(out), "--logprobs", "--with-text", "--concurrency", "8"]) == 0
    labelled = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(labelled) == N and all("token_confidence" in r["tiers"]["small"] for r in labelled)

    result = subprocess.run([sys.executable, "-m", MODULE, str(out), "--out", str(tmp_path / "r.json"),
                             "--plot", str(tmp_path / "r.png")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert json.loads((tmp_path / "r.json").read_text()) == report
    assert report["tiers"] == ["small", "big"] and report["n"] == N
    assert report["accuracy"] == {"small": 0.8, "big": 0.95}
    assert {"prior", "prior_difficulty", "mean", "lowest_group", "tail", "combined", "oracle", "random"} <= set(
        report["apgr"])
    assert report["apgr"]["lowest_group"]["apgr"] > 0.8
    low, high = report["apgr"]["lowest_group"]["ci95"]
    assert low <= report["apgr"]["lowest_group"]["apgr"] <= high
    assert set(report["auc_wrong"]["small"]) == {"mean", "lowest_group", "tail", "prior"}
    assert report["auc_wrong"]["small"]["lowest_group"] > 0.8 and report["auc_wrong"]["big"]["mean"] == 1.0
    assert report["calibration"]["small"][0] > 0 and report["calibration"]["big"][0] > 0  # [slope, intercept]
    assert report["calibration_toml"].startswith('calibration = { "small" = [') and '"big" = [' in report[
        "calibration_toml"]
    point = report["operating_point"]
    assert set(point) == {"rule", "confidence", "prior"} and "in-sample" in point["rule"]
    assert 0 < point["confidence"]["escalated"] < 1 and point["confidence"]["accuracy"] >= 0.8
    assert (tmp_path / "r.png").stat().st_size > 10_000

    few = tmp_path / "few.jsonl"
    few.write_text("".join(line + "\n" for line in out.read_text().splitlines()[:10]))
    for args, message in (([str(tmp_path / "missing.jsonl")], "cannot read outcomes"),
                          ([str(out), "--tiers", "small,nope"], "unknown tier(s) nope"),
                          ([str(few)], "10 rows have")):
        bad = subprocess.run([sys.executable, "-m", MODULE, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_a_router_without_tier_a_is_one_line_and_exit_2(tmp_path) -> None:
    outcomes = tmp_path / "o.jsonl"
    outcomes.write_text("".join(
        f'{{"id": "x:{i}", "prompt": "q{i}", "tiers": {{"small": {{"correct": {str(i % 3 == 0).lower()}, '
        f'"finish_reason": "stop", "token_confidence": {{"tokens": 40, "group": 32, "mean": 0.{i + 10}, '
        f'"lowest_group": 0.{i + 10}, "tail": 0.{i + 10}}}}}, "big": {{"correct": true}}}}}}\n' for i in range(30)))
    router = ROOT / "models" / "routers" / "embedded-gsm8k"
    done = subprocess.run([sys.executable, "-m", MODULE, str(outcomes), "--no-prior", "--router", str(router)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "has no tier 'small'" in done.stderr
