"""`cascade optimize plan|allocate` and `cascade deploy` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec

from cascade.plan import Plan

HEAVY = ("highspy", "pymoo", "matplotlib", "scipy", "torch", "litestar", "sklearn")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cascade.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_of_the_planner_commands_imports_no_solver() -> None:
    probe = (
        "import sys\nfrom cascade.cli import main\n"
        "for command in (['optimize'], ['optimize', 'plan'], ['optimize', 'allocate'], ['deploy']):\n"
        "    try:\n        main([*command, '--help'])\n    except SystemExit as e:\n        assert e.code == 0\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_plan_writes_the_plan_report_figure_and_latency_table(small_problem, tmp_path) -> None:
    out = tmp_path / "plans" / "plan.json"
    result = run("optimize", "plan", "--spec", str(small_problem), "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert {"plan", "objective", "latency_s", "quality", "thresholds", "allocation"} <= set(summary)
    plan = msgspec.json.decode(out.read_bytes(), type=Plan)
    assert plan.tiers == ["small", "large"] and sum(summary["allocation"].values()) == 8
    assert "## Operating points" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The cached l(f) table is valid input for `allocate`, which finds the same latency.
    table = out.with_suffix(".latency.json")
    allocated = json.loads(run("optimize", "allocate", "--table", str(table), "--json").stdout)
    assert allocated["status"] == "optimal"
    assert abs(allocated["latency_s"] - summary["latency_s"]) <= 1e-6 * summary["latency_s"]


def test_a_bad_problem_file_is_one_line_and_exit_2(tmp_path) -> None:
    bad = tmp_path / "problem.toml"
    bad.write_text('[cluster]\ngpu = "h100-sxm"\ngpus = 8\n')
    result = run("optimize", "plan", "--spec", str(bad), "--out", str(tmp_path / "p.json"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "missing required key `tiers`" in result.stderr
    missing = run("optimize", "allocate", "--table", str(tmp_path / "none.json"), "--json")
    assert missing.returncode == 2 and "cannot read latency table" in missing.stderr


def _two_tier_plan(tmp_path, first: dict[str, object]) -> Path:
    """plan.json with tier `a` as given and tier `b` on 4 GPUs (TP4), for `cascade deploy`."""
    plan = {"tiers": ["a", "b"], "operating_points": [], "gpu": "h100-sxm", "gpus_per_node": 8,
            "deployment": [first, {"tier": "b", "gpus": 4, "replicas": 1, "tp": 4, "model": "org/b"}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_deploy_dry_run_prints_sglang_commands_and_the_gateway_config(tmp_path) -> None:
    path = _two_tier_plan(tmp_path, {"tier": "a", "gpus": 4, "replicas": 2, "tp": 2, "model": "org/a"})
    result = run("deploy", "--plan", str(path), "--engine", "sglang", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("python -m sglang.launch_server") == 3
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 python -m sglang.launch_server --model-path org/b" in out
    assert "--tp-size 2" in out and 'url = "http://127.0.0.1:30001"' in out
    refused = run("deploy", "--plan", str(path))
    assert refused.returncode == 2 and "--dry-run" in refused.stderr


def test_plan_json_names_the_slowest_tier_p95_and_the_end_to_end_p95_and_explains_each_allocation(
        small_problem, tmp_path) -> None:
    out = tmp_path / "plan.json"
    summary = json.loads(run("optimize", "plan", "--spec", str(small_problem), "--out", str(out), "--json",
                             "--no-figure").stdout)
    plan = msgspec.json.decode(out.read_bytes(), type=Plan)
    slowest = max(plan.deployment, key=lambda d: d.predicted_p95_latency_s or 0.0)
    balanced = next(p for p in plan.operating_points if p.hint == "balanced")
    assert summary["slowest_tier_p95_s"] == summary["latency_s"]  # the old key keeps its meaning
    assert summary["slowest_tier"] == slowest.tier
    assert summary["e2e_p95_s"] == balanced.predicted_e2e_p95_latency_s
    assert set(summary["allocation_reasons"]) == set(plan.tiers)
    for d in plan.deployment:
        reason = summary["allocation_reasons"][d.tier]
        assert "\n" not in reason and f"on {d.gpus} GPU(s)" in reason and f"{d.arrival_rate_rps:.4g} req/s" in reason
    human = run("optimize", "plan", "--spec", str(small_problem), "--out", str(out), "--no-figure")
    assert "slowest tier p95" in human.stdout and "end-to-end p95" in human.stdout
    assert "Why each tier got its GPUs" in out.with_suffix(".md").read_text()


def test_deploy_dry_run_names_the_absolute_files_it_would_write_and_hf_token_for_a_gated_model(tmp_path) -> None:
    _two_tier_plan(tmp_path, {"tier": "a", "gpus": 4, "replicas": 1, "tp": 4,
                              "model": "meta-llama/Llama-3.1-8B-Instruct"})
    result = subprocess.run([sys.executable, "-m", "cascade.cli", "deploy", "--plan", "plan.json", "--dry-run",
                             "--log-dir", "engine-logs"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"the gateway config {tmp_path / 'plan.cascade.toml'}," in result.stdout
    assert f"{tmp_path / 'engine-logs'}/<tier>-<replica>.log" in result.stdout
    [token] = [line for line in result.stdout.splitlines() if "HF_TOKEN" in line]
    assert "meta-llama/Llama-3.1-8B-Instruct: gated" in token and "org/b" not in token
    path = _two_tier_plan(tmp_path, {"tier": "a", "gpus": 4, "replicas": 1, "tp": 4, "model": "org/a"})
    local = run("deploy", "--plan", str(path), "--dry-run", "--engine", "local", "--engine-command", "echo {port}",
                "--log-dir", str(tmp_path / "logs"))
    assert local.returncode == 0, local.stderr
    assert f"engine log {tmp_path / 'logs' / 'a-0.log'}" in local.stdout and "HF_TOKEN" not in local.stdout
    hint = run("deploy", "--plan", str(path), "--dry-run")
    assert "a gated model (meta-llama/*" in hint.stdout  # no gated model: the hint only
