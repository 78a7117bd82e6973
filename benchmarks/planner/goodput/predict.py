"""The planner's simulator beside the twin (issue 62 item 4): what cascade/optimizer/evaluate.py predicts for each
arm of a goodput run, next to what the emulated GPUs measured. Prints JSON.

Each fold's prediction is made from what the planner knows: the training fold's planning rows (benchmarks/planner/
goodput/folds.py: out-of-fold route scores, per-tier correctness and token counts), the tiers' measured H200
profiles and the arm's allocation (one TP1 replica per GPU), the problem `cascade optimize plan` was given for that
rate (benchmarks/planner/goodput/plans.py). Requests arrive as Poisson at the arm's rate, each answered by the tier
the arm's routing gives its row:

    a, b   every row on the plain 1.5B, or on the reasoning tier
    e      the plan's thresholds for the quality target, on the rows' route scores (the planner's own prediction)
    c      the learned router at the tier shares the twin measured (thresholds at those quantiles of the scores:
           the gateway calibrates its own, which the planner does not model)
    d      rows drawn at random in the tier shares the twin measured

Predicted per arm and rate (the two folds averaged): accuracy, p95 end-to-end latency, SLO attainment (both SLOs:
a voted answer's first token comes when its vote is decided, so its TTFT is its end to end; a direct answer's TTFT,
which the simulator does not return, counted as met) and end to end alone, and correct-within-SLO goodput per GPU
(both SLOs).
A request routed to a tier without GPUs never finishes, as the twin's fails.

Two predictions per arm: `predicted` from the planning rows as the planner reads them (the reasoning tier's vote as
one sequence of all the tokens its branches decoded), and `predicted_waves` with the reasoning tier's vote as the twin
runs it: its branches side by side in the adaptive waves of the ladder's `[tiers.branches]` (the first wave, then
the rest where the first wave disagreed: simulator.simulate_waves), their lengths the records the twin replays
(`recorded_waves`). The gap between the two is what planning the vote from branch records would close.

    .venv/bin/python -m benchmarks.planner.goodput.predict --summary runs/goodput_g8_poisson.json \
        [--work runs/goodput_per_gpu] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.planner.goodput.arms import PLAIN_TIER, REASON_TIER
from benchmarks.planner.goodput.folds import TIERS, Fold, build
from benchmarks.planner.goodput.plans import problem_toml
from benchmarks.planner.goodput_per_gpu import plan_dir
from cascade.config import load_config
from cascade.optimizer import evaluate
from cascade.optimizer.instance import Instance, load_instance
from cascade.optimizer.problem import load_problem
from cascade.optimizer.search import Deployment
from cascade.plan import load_plan
from cascade.testing.fakes.recorded import read_tier
from cascade.testing.scripts import print_result
from cascade.testing.twin import EMBEDDED_LADDER, V8_TWIN

SEEDS = (0, 1, 2)  # arrival seeds of the simulation, averaged
REQUESTS = 3000  # simulated requests per seed (the first 10 % dropped as warm-up)
WARMUP = 0.1


def instance(fold: Fold, gpus: int, rate: float, target: str, max_running: int, e2e_slo_s: float, work: Path
             ) -> Instance:
    """The planner's instance for `fold` at `rate` (the problem plans.py gives `cascade optimize plan`)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "problem.toml"
    spec.write_text(problem_toml(fold, gpus, rate, target, max_running, e2e_slo_s))
    problem, base = load_problem(spec)
    return load_instance(problem, base)


def routing_of(arm: str, inst: Instance, shares: dict[str, float], plan: Path | None, quality: float,
               seed: int = 0) -> np.ndarray:
    """Each planning row's answering tier (an index into TIERS) under the arm's routing."""
    n = inst.data.quality.shape[0]
    signal = inst.data.signal
    if arm.startswith("a-"):
        return np.full(n, TIERS.index(PLAIN_TIER))
    if arm.startswith("b-"):
        return np.full(n, TIERS.index(REASON_TIER))
    if arm.startswith(("e-", "f-", "t-")):  # f: as planned (the simulator has no load-reactive routing)
        assert plan is not None
        points = load_plan(plan).operating_points
        point = min(points, key=lambda p: abs((p.quality_target or 0.0) - quality))
        return np.searchsorted(np.sort(point.thresholds), signal, side="right")
    share = np.array([shares.get(t, 0.0) for t in TIERS])
    share = share / share.sum()
    if arm.startswith("c-"):  # the hardest rows (highest route score) to the top tiers, in the measured shares
        cuts = np.quantile(signal, np.cumsum(share)[:-1])
        return np.searchsorted(cuts, signal, side="right")
    return np.asarray(np.random.default_rng(seed).choice(len(TIERS), size=n, p=share))  # d: at random


def recorded_waves(ids: list[str]) -> tuple[np.ndarray, int]:
    """The reasoning tier's branch lengths per question of `ids` as the twin replays its adaptive vote, (ids, N)
    with 0 for a branch never launched, and the first wave: the first wave's recorded branches, and all N where
    their answers differ (an unreadable answer agrees with none). A question with one recorded answer replays it on
    every branch (cascade/testing/fakes/recorded.py), so its first wave agrees."""
    settings = next(t for t in load_config(EMBEDDED_LADDER).tiers if t.name == REASON_TIER).branches
    records = read_tier(next(t for t in V8_TWIN if t.tier == REASON_TIER).records, REASON_TIER)
    first, n = settings.first_wave, settings.n
    out = np.zeros((len(ids), n), dtype=np.int64)
    for i, question in enumerate(ids):
        record = records[question]
        if not record.branches:
            out[i, :first] = record.output_tokens or 1
            continue
        answers = {b.answer for b in record.branches[:first]}
        launched = first if len(answers) == 1 and None not in answers else n
        out[i, :launched] = [max(1, b.output_tokens) for b in record.branches[:launched]]
    return out, first


def with_waves(inst: Instance, fold: Fold) -> Instance:
    """`inst` with the reasoning tier's vote as branches in waves (`recorded_waves`) instead of one sequence."""
    lengths, first = recorded_waves(fold.trained_on)
    if len(lengths) != inst.output_tokens.shape[0]:
        raise ValueError(f"fold {fold.name}: {len(lengths)} questions, {inst.output_tokens.shape[0]} planning rows")
    tier = inst.names.index(REASON_TIER)
    branch_tokens = list(inst.branch_tokens) or [None] * len(inst.names)
    branch_tokens[tier] = lengths
    first_waves = [first if i == tier else 0 for i in range(len(inst.names))]
    return dataclasses.replace(inst, branch_tokens=branch_tokens, first_waves=first_waves, curves={})


def predict(inst: Instance, replicas: dict[str, int], final: np.ndarray, rate: float, e2e_slo_s: float,
            ttft_slo_s: float = math.inf) -> dict[str, float]:
    """The arm's prediction. `slo_attainment`: both SLOs, a voted answer's first token at its end (the gateway
    streams a vote's answer once the vote is decided: the twin measures its TTFT equal to its end to end), a direct
    answer's first token taken as within its SLO (the simulator returns end-to-end latency only)."""
    gpus = sum(replicas.values())
    deployment = Deployment(gpus=[replicas.get(t, 0) for t in inst.names], groups=[0] * len(inst.names))
    tables = inst.routed_tables(final)
    voting = np.array([w.n > 1 for w in inst.widths] if inst.widths else [False] * len(inst.names))
    voting[inst.names.index(REASON_TIER)] = True
    good, within, within_both, correct, p95 = [], [], [], [], []
    for seed in SEEDS:
        rows, latency = evaluate.routed_latencies(inst, tables, deployment, final, rate, REQUESTS, seed)
        keep = slice(int(WARMUP * REQUESTS), None)
        rows, latency = rows[keep], latency[keep]
        right = inst.data.quality[rows, final[rows]] > 0.5
        ok = latency <= e2e_slo_s
        both = ok & ((latency <= ttft_slo_s) | ~voting[final[rows]])
        good.append(float(np.mean(right & both)))
        within.append(float(np.mean(ok)))
        within_both.append(float(np.mean(both)))
        correct.append(float(np.mean(right)))
        p95.append(float(np.percentile(latency, 95)))
    return {"accuracy": float(np.mean(correct)), "slo_attainment": float(np.mean(within_both)),
            "slo_attainment_e2e": float(np.mean(within)), "goodput_per_gpu": rate * float(np.mean(good)) / gpus,
            "p95_e2e_s": float(np.mean(p95))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--summary", type=Path, required=True, help="a goodput_per_gpu --json-out file")
    p.add_argument("--work", type=Path, default=Path("runs/goodput_per_gpu"), help="its --out folder")
    p.add_argument("--json-out")
    args = p.parse_args(argv)
    run = json.loads(args.summary.read_text())
    work = args.work.resolve()
    folds = build(work / "folds", vote=run.get("planning_vote", "sequence"))
    gpus, setting = run["gpus"], run["setting"]
    tag = "" if run.get("target", "plain") == "plain" else f"-{run['target']}"
    e2e_slo_s = setting["e2e_slo_s"]
    result: dict[str, Any] = {"summary": str(args.summary), "gpus": gpus, "e2e_slo_s": e2e_slo_s, "arms": {}}
    for arm, measured in run["arms"].items():
        rows: dict[str, Any] = {}
        for rate_key, m in measured["by_rate"].items():
            rate = float(rate_key)
            per_fold, per_fold_waves = [], []
            for fold in folds:
                target = run["quality_target"][fold.name]
                inst = instance(fold, gpus, rate, f"{target:.4f}", setting["max_running"], e2e_slo_s,
                                work / "predict" / f"g{gpus}{tag}" / f"rate-{rate_key}" / f"fold-{fold.name}")
                replicas = m["replicas"].get(fold.name, m["replicas"]) if arm[0] in "deftu" else m["replicas"]
                plan = plan_dir(work, gpus, tag, arm[0], fold, rate, run.get("plan_slo", "e2e")) / "plan.json"
                final = routing_of(arm, inst, m["tier_shares"], plan if arm[0] in "eft" else None, target)
                ttft = setting["ttft_slo_s"]
                per_fold.append(predict(inst, replicas, final, rate, e2e_slo_s, ttft))
                per_fold_waves.append(predict(with_waves(inst, fold), replicas, final, rate, e2e_slo_s, ttft))
            predicted = {k: round(float(np.mean([f[k] for f in per_fold])), 4) for k in per_fold[0]}
            waves = {k: round(float(np.mean([f[k] for f in per_fold_waves])), 4) for k in per_fold_waves[0]}
            rows[rate_key] = {"predicted": predicted, "predicted_waves": waves,
                              "measured": {k: m.get(k) for k in ("accuracy", "slo_attainment", "goodput_per_gpu",
                                                                 "p95_e2e_s")}}
            print(f"{arm} rate {rate_key}: predicted {predicted}, with waves {waves}", file=sys.stderr, flush=True)
        result["arms"][arm] = rows
    print_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
