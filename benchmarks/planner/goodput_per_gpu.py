"""Correct answers within the SLO per GPU, end to end (issue 62 item 3): the arms on the same emulated GPUs and the
same questions. Prints JSON.

The GPUs are emulated from H200 step times measured for each model (cascade/testing/fakes/gpu.py, profiles in
models/gpu/profiles/h200/) and answer what the embedded ladder's real models answered (cascade/testing/twin.py); the
gateways, router, branch runner and grader are the real ones, over real HTTP (benchmarks/planner/goodput/run.py).
Questions: the 384 of models/outcomes/gsm8k-train-embedded-v8.jsonl in two folds, each served by a router trained
on the other (benchmarks/planner/goodput/folds.py); every fold's questions are sent equally often.

Arms (benchmarks/planner/goodput/arms.py), all on G GPUs:
  a  the plain deployment: SGLang's model gateway (`smg`, round robin) over G replicas of the 1.5B answering directly
  b  every request to the reasoning tier (the 1.5B's vote of up to 8 sampled branches) on G replicas
  c  cascade's learned router, the GPUs split evenly over the four tiers, the quality hint = the plain deployment's
     accuracy on the router's training fold
  d  the null of e: route scores drawn at random (`[routing] policy = "random"`) on e's allocation at each rate,
     the split calibrated to the same target on the same training fold
  e  `cascade optimize plan` for the target and the rate on the training fold (benchmarks/planner/goodput/plans.py):
     its allocation, its thresholds on the learned router's score; each fold on its own fleet at the full rate
  t  e planned for the target's traffic alone (`[cluster] deploy_every_tier = false`): a tier the target's point
     sends nothing to gets no GPU (by default each keeps one for the `fast` and `best` points)
  f  e with load-reactive routing (`[routing.load]`, the end-to-end SLO watched): requests ask for `balanced`, the
     plan's point for the target, and move to `fast` while a tier is pressed
  g  t with SGLang's model gateway picking the replica: each tier's replicas behind their own smg (`cache_aware`),
     that smg the tier's one backend in cascade's config; cascade still routes, runs the vote and streams
     (benchmarks/planner/goodput/smg.py says what cascade's aborts and engine poller meet there)
  r  b with the prefix replica choice (as p is t with it): the single-model vote given the same co-location, as
     SGLang's own `n` sampling would run it (all of a request's samples on one engine)
  p  t with cascade's own prefix-affine replica choice on every tier (`[tiers.replicas] choice = "prefix"`:
     consistent hashing with bounded loads on the prompt, so a vote's branches share a replica while loads allow):
     g's co-location without smg

SLOs, stated from the measured step times: u = the 1.5B's prefill of 256 tokens + 512 decode steps alone (1.96 s);
TTFT <= 2.5 u, end-to-end <= 5 u. Limits of the emulation: each engine runs at most `--max-running` sequences
(SGLang's --max-running-requests) and streams every `--stream-interval` tokens, because this machine emulates at
most a few hundred concurrent sequences; the step times are an unfused decoder's (SGLang's own step is faster).

The planned arms (d, e, f, t, u) are planned with the reasoning tier's vote as the ladder serves it (`--vote waves`,
the default: its recorded branches, voted and timed in adaptive consistency's two waves); `--vote sequence` plans
it as one sequence of all its branches' tokens, as the results before that were made (their plans and points keep
their folders). `--plan-slo both` plans them with both SLOs in problem.toml's `[slo]` (`ttft_s`, `e2e_s`: the planner
then holds the voting tier to the TTFT SLO, its answer streaming once the vote is decided) instead of the end-to-end
one alone (`e2e`, the default, as the results before); its plans and points keep folders of their own.
Points are saved under --out as they finish (a rerun skips them). Usage:
  .venv/bin/python -m benchmarks.planner.goodput_per_gpu --arms a,b,c --rates 50,100,200 [--seeds 0,1,2]
  [--gpus 8] [--arrival poisson|gamma] [--plan-slo e2e|both] [--out runs/goodput_per_gpu] [--json-out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.planner.goodput import arms as arm_defs
from benchmarks.planner.goodput.folds import VOTES, Fold, build
from benchmarks.planner.goodput.plans import planned
from benchmarks.planner.goodput.run import Setting, measure
from benchmarks.planner.goodput.scores import held_rate, pooled_engines, summarize
from cascade.optimizer.profile import load_profile
from cascade.testing.scripts import print_result
from cascade.testing.twin import H200

UNIT_PROMPT_TOKENS, UNIT_DECODE_STEPS = 256, 512
QUESTIONS = 192  # per fold
TIME_SCALE = 4.0  # wall seconds per emulated second, by default
ACCURACY_SLACK = 0.01  # a rate is held at accuracy >= the target less this (two questions of 192)
# Arm f's hint: the plan's operating point for it is the target's (the planner names the target's point `balanced`),
# and `fast`, the next cheaper one, is where load-reactive routing moves it while a tier is pressed.
LOAD_REACTIVE_HINT = "balanced"


def slo_unit_s() -> float:
    """u: the plain model's prefill of a 256-token prompt and 512 decode steps alone, from its measured profile."""
    p = load_profile(H200 / "qwen2.5-coder-1.5b.json")
    prefill = p.prefill.fixed_s + p.prefill.per_token_s * UNIT_PROMPT_TOKENS
    decode = sum(p.decode.fixed_s + p.decode.per_sequence_s + p.decode.per_context_token_s * (UNIT_PROMPT_TOKENS + i)
                 for i in range(UNIT_DECODE_STEPS))
    return prefill + decode


# Served on each fold's plan (t and its null u: planned with `[cluster] deploy_every_tier = false`, the others with
# the default)
PLANNED = {"e": "e-plan", "d": "d-random-null-plan", "f": "f-plan-load-reactive", "t": "t-plan-target-fleet",
           "u": "u-random-null-target-fleet", "g": "g-plan-target-fleet-smg",
           "p": "p-plan-target-fleet-prefix"}
TARGET_FLEET = "tugp"  # g and p serve t's plans
TIER_SMG_POLICY = "cache_aware"  # arm g's replica picker: smg's default policy
NULLS = "du"
ALL_REASONING_PREFIX = "r-all-reasoning-prefix"  # b with the prefix replica choice: a vote's branches on one replica
PLAN_SLOS = ("e2e", "both")  # the SLOs the planned arms' problem.toml gives the planner (--plan-slo)


def planned_point(letter: str, folds: list[Fold], rate: float, seed: int, setting: Setting, work: Path,
                  quality: dict[str, str], gpus: int, tag: str = "", plan_slo: str = "e2e") -> dict[str, Any]:
    """Arm e (or its null d) at one rate: each fold planned on its training questions and served on its own fleet at
    the full rate (the plans' allocations differ), the two runs pooled. d keeps the plan's allocation and replaces
    its routing by random route scores calibrated to the same target on the same fold; u does the same on t's plan;
    g serves t's plan with each tier's replicas behind one smg, p with cascade's prefix replica choice."""
    runs = []
    for fold in folds:
        arm = planned(fold, gpus, rate, quality[fold.name], setting.max_running, setting.e2e_slo_s,
                      plan_dir(work, gpus, tag, letter, fold, rate, plan_slo), every_tier=letter not in TARGET_FLEET,
                      ttft_slo_s=setting.ttft_slo_s if plan_slo == "both" else None)
        hints = quality
        if letter in NULLS:
            arm = arm_defs.random_null(arm.replicas, [fold], PLANNED[letter])
        elif letter == "t":
            arm = dataclasses.replace(arm, name=PLANNED["t"])
        elif letter == "g":
            arm = dataclasses.replace(arm, name=PLANNED["g"], tier_smg=TIER_SMG_POLICY)
        elif letter == "p":
            arm = dataclasses.replace(arm, name=PLANNED["p"], replica_choice="prefix")
        elif letter == "f":  # a named hint: load-reactive routing moves those (a numeric one keeps its target)
            arm = dataclasses.replace(arm, name=PLANNED["f"], load_reactive=True)
            hints = {fold.name: LOAD_REACTIVE_HINT}
        runs.append(measure(arm, [fold], rate, seed, setting, work / "scratch" / arm.name, hints))
    return {"arm": PLANNED[letter], "rate": rate, "seed": seed, "gpus": gpus,
            "replicas": {f.name: r["replicas"] for f, r in zip(folds, runs, strict=True)},
            "lag_s": max(r["lag_s"] for r in runs), "engines": {**pooled_engines(runs), "requests_by_engine": {
                f.name: r["engines"]["requests_by_engine"] for f, r in zip(folds, runs, strict=True)}},
            "wall_s": sum(r["wall_s"] for r in runs),
            "requests": [row for r in runs for row in r["requests"]]}


def plan_dir(work: Path, gpus: int, tag: str, letter: str, fold: Fold, rate: float, plan_slo: str = "e2e") -> Path:
    """Where arm `letter`'s plan for `fold` at `rate` lives (plans made on "sequence" planning rows keep the folder
    they were made in before the planner modelled the vote's waves, and plans with the end-to-end SLO alone the one
    they were made in before the planner knew the TTFT SLO)."""
    fleet_tag = "-target-fleet" if letter in TARGET_FLEET else ""
    return work / "plans" / f"g{gpus}{tag}{fleet_tag}{plan_tag(fold.vote, plan_slo)}" / f"rate-{rate:g}" / \
        f"fold-{fold.name}"


def plan_tag(vote: str, plan_slo: str) -> str:
    """The folder suffix of plans (and their points) made with this vote model and these SLOs."""
    return ("" if vote == "sequence" else f"-{vote}") + ("" if plan_slo == "e2e" else f"-slo-{plan_slo}")


def target_accuracy(fold: Fold, target: str) -> float:
    plain = fold.accuracy[arm_defs.PLAIN_TIER]
    return plain if target == "plain" else (plain + fold.accuracy[arm_defs.REASON_TIER]) / 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", default="a,b,c", help="comma-separated arm letters")
    p.add_argument("--rates", default="50,100,200", help="offered emulated requests/s, comma-separated")
    p.add_argument("--seeds", default="0", help="arrival seeds, comma-separated")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--arrival", choices=["poisson", "gamma"], default="poisson")
    p.add_argument("--burstiness", type=float, default=0.25, help="gamma shape (0.25: CV 2)")
    p.add_argument("--time-scale", type=float, default=TIME_SCALE, help="wall seconds per emulated second (raise it "
                   "when a point's lag_s says the CPU fell behind the emulated GPUs)")
    p.add_argument("--max-running", type=int, default=64, help="sequences per engine (SGLang --max-running-requests)")
    p.add_argument("--stream-interval", type=int, default=16, help="tokens per streamed chunk (SGLang's option)")
    p.add_argument("--requests-per-fold", type=int, default=384, help="at least this many per fold, a multiple of 192 "
                   "(every question as often)")
    p.add_argument("--duration-s", type=float, default=10.0, help="and at least this many emulated seconds of arrivals")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap draws (0: no intervals)")
    p.add_argument("--fold-seed", type=int, default=0)
    p.add_argument("--target", choices=["plain", "mid"], default="plain",
                   help="the quality target: the plain deployment's accuracy on each training fold, or halfway from "
                        "it to the reasoning tier's (where a single-model deployment must be all reasoning)")
    p.add_argument("--vote", choices=VOTES, default="waves",
                   help="how the planner reads the reasoning tier's vote: its recorded branches in the ladder's two "
                        "waves, or one sequence of all their tokens (the results before the planner modelled waves)")
    p.add_argument("--plan-slo", choices=PLAN_SLOS, default="e2e",
                   help="the SLOs the planned arms are planned with: the end-to-end one as the plan's latency (e2e), "
                        "or both, so that the planner holds the voting tier to the TTFT SLO")
    p.add_argument("--out", type=Path, default=Path("runs/goodput_per_gpu"),
                   help="work folder: folds, plans, points (question text: never committed)")
    p.add_argument("--json-out", help="also write the summary here")
    p.add_argument("--saved-only", action="store_true", help="summarize the points already measured; run none")
    p.add_argument("--quick", action="store_true",
                   help="G = 4, arm c, one low rate, 96 requests per fold, no intervals: a plumbing check")
    args = p.parse_args(argv)
    if args.quick:
        args.gpus, args.arms, args.rates, args.requests_per_fold, args.resamples = 4, "c", "10", 96, 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.out.resolve()
    folds = build(work / "folds", args.fold_seed, args.vote)
    unit = slo_unit_s()
    setting = Setting(time_scale=args.time_scale, max_running=args.max_running, stream_interval=args.stream_interval,
                      ttft_slo_s=2.5 * unit, e2e_slo_s=5 * unit, requests_per_fold=args.requests_per_fold,
                      arrival=args.arrival, burstiness=args.burstiness)
    makers = {"a": lambda: arm_defs.plain(args.gpus), "b": lambda: arm_defs.all_reasoning(args.gpus),
              "r": lambda: dataclasses.replace(arm_defs.all_reasoning(args.gpus), name=ALL_REASONING_PREFIX,
                                               replica_choice="prefix"),
              "c": lambda: arm_defs.learned_even(args.gpus, folds)}
    # The target, from each router's training fold, to 4 decimals, rounded down
    target = {f.name: math.floor(target_accuracy(f, args.target) * 10_000) / 10_000 for f in folds}
    tag = "" if args.target == "plain" else f"-{args.target}"
    # Points measured at another time scale keep a folder of their own (a rerun never mixes them with the default's)
    scale_tag = "" if args.time_scale == TIME_SCALE else f"-ts{args.time_scale:g}"
    quality = {name: f"{value:.4f}" for name, value in target.items()}
    rates = [float(r) for r in args.rates.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    result: dict[str, Any] = {"gpus": args.gpus, "arrival": args.arrival, "setting": dataclasses.asdict(setting),
                              "slo_unit_s": round(unit, 4), "target": args.target, "quality_target": target,
                              "planning_vote": args.vote, "plan_slo": args.plan_slo, "arms": {}}
    for letter in args.arms.split(","):
        by_rate: dict[float, dict[str, Any]] = {}
        name = PLANNED.get(letter) or makers[letter]().name
        for rate in rates:
            per_fold = max(args.requests_per_fold, rate * args.duration_s / len(folds))
            point_setting = dataclasses.replace(setting, requests_per_fold=QUESTIONS * math.ceil(per_fold / QUESTIONS))
            points = []
            for seed in seeds:
                vote_tag = plan_tag(args.vote, args.plan_slo) if letter in PLANNED else ""
                path = (work / "points" / f"g{args.gpus}-{args.arrival}{tag}{scale_tag}" / f"{name}{vote_tag}" /
                        f"rate-{rate:g}-seed-{seed}.json")
                if not path.exists() and args.saved_only:
                    continue
                if not path.exists():
                    print(f"{name} rate {rate:g} seed {seed} ...", file=sys.stderr, flush=True)
                    if letter in PLANNED:
                        point = planned_point(letter, folds, rate, seed, point_setting, work, quality, args.gpus,
                                              tag, args.plan_slo)
                    else:
                        point = measure(makers[letter](), folds, rate, seed, point_setting, work / "scratch" / name,
                                        quality)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(point))
                points.append(json.loads(path.read_text()))
            if not points:
                continue
            by_rate[rate] = summarize(points, setting.ttft_slo_s, setting.e2e_slo_s, args.resamples)
            by_rate[rate]["replicas"] = points[0]["replicas"]
        result["arms"][name] = {"by_rate": {f"{r:g}": s for r, s in by_rate.items()},
                                "held_rate": held_rate(by_rate, min(target.values()) - ACCURACY_SLACK)}
    print_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
