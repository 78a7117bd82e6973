"""Load-reactive operating points against the baselines a careful operator would use, at 1x / 1.5x / 2x of
capacity, several seeds, on two ladders of fake engines that answer as real models did. Prints JSON.

Ladders (each tier a fake engine, in this process on 127.0.0.1, answering a GSM8K training question with the
answer and length its model gave in labelled outcomes; the questions are those the labels cover):
  * `qwen15`: Qwen2.5-Coder-1.5B answering directly (greedy: models/outcomes/qwen15-train-bench/greedy) and the
    same model's vote of 8 sampled branches (sc-t07/branches.jsonl: each branch request answers as labelled branch
    `seed % 8` did; 8 run, 8 finish, no pruning). On the 100 questions both cover: 0.60 and 0.75 (majority@8, a
    tie to the shortest branch as the gateway breaks it), so a degraded answer is still a real one (0.8x). Routed
    by the heuristic difficulty: no router is trained on this ladder yet. `balanced` sends half the requests to the
    vote (the median difficulty; an operator's choice).
  * `v6`: the former embedded default's ladder, learned router and `balanced` point, as
    benchmarks/router/load_reactive.py runs it (models/outcomes/gsm8k-train-embedded-v6.jsonl): SmolLM2-135M 0.01,
    Qwen2.5-Coder-0.5B 0.28; `fast` is SmolLM2. The ladder behind the earlier 1.73x (docs/measured.md).
  * `v7`: the embedded default's four tiers (SmolLM2-135M 0.01, Qwen2.5-Coder-0.5B 0.33, the 1.5B direct 0.66, its
    SART tier 0.72; models/outcomes/gsm8k-train-embedded-v7.jsonl, 384 questions) and its router. `balanced` sends
    89% to the 1.5B direct and 11% to SmolLM2; `fast` is the router's calibrated point (31% / 29% / 40% to the
    three direct tiers, 0.40 on these questions), not SmolLM2 alone: an operator who lets load move requests
    gives them somewhere real to go. The static sweep moves the 0.5B / 1.5B cut (`--v7-shares`: the share sent to
    the 1.5B or above; the rest above SmolLM2's cut go to the 0.5B). Speeds keep the models' order (ITL 1 : 2 : 4;
    measured alone 34 / 65 / 152 ms).
Engines: `--qwen15-speeds` / `--v6-speeds` / `--v7-speeds` per tier (TTFT ms / ms per labelled token alone / batch
slots); a tier's time between tokens grows with the streams it decodes (FakeEngine `itl_batch_slope`) to
`--full-batch-x` x at a full batch. An answer is sent `--token-scale` labelled tokens to a chunk (each chunk that
many tokens' time): the same latencies for a fraction of the gateway's CPU.
Capacity (1x): from the labels, the rate at which `balanced` fills its busiest tier's slots when every answer
decodes at a full batch's speed (tier capacity = slots / branches requests; service = TTFT + tokens x ITL, the
longest of a vote's branches).
Arms, one `cascade serve` each, all on the same arrivals and the same question per request:
  * `static`: `balanced` as configured, no admission limit (the earlier benchmark's baseline).
  * `capped@S`: static thresholds sending a share S of requests to the upper tier (`--qwen15-shares`, ...; the
    configured one is `static_capped`), and each tier's `max_in_flight` at its capacity (x `--cap-x`): overload
    answers 429.
  * `static_best`: per load, the `capped@S` with the best mean correct goodput over the seeds: chosen on the same
    seeds it is scored on, an oracle that favours the baseline.
  * `reactive`: `balanced` as configured, `[routing.load]` (the SLO, `max_in_flight` = the same capacities) and the
    same per-tier caps. Its latency window and hold are scaled to these short segments (3 s, 2 s).
  * `reactive_capacity`: the same without the latency signal (`max_in_flight` alone).
Arrivals: per seed, per load, `--segment-s` of Poisson arrivals at load x capacity, then a pause for the arm to
drain (longer for `static`, whose queue has to empty: it does not count); all of an arm's segments one trace, sent
by one `cascade loadgen` run. Correct goodput: requests graded correct AND within every SLO, per segment second; a
429, a timeout or an error is neither. Intervals: arms paired by seed (the same arrivals): per-seed ratios, their
mean with a t 95% interval, and a bootstrap over seeds of the ratio of mean goodputs.
Usage: .venv/bin/python -m benchmarks.router.load_reactive_fair [--ladders qwen15,v6,v7] [--seeds 5] [--out F.json]
[--plot F.png]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
from scipy import stats

from cascade.data.datasets import load
from cascade.data.grading import reference_answer
from cascade.data.outcomes import read_rows
from cascade.data.records import read_request_records
from cascade.router.heuristic import heuristic_difficulty
from cascade.router.learned import LearnedSignal
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript, ScriptHook
from cascade.testing.processes import CASCADE
from cascade.testing.scripts import print_result
from cascade.testing.servers import serve_config

REPO = Path(__file__).resolve().parents[2]
V6 = REPO / "models/outcomes/gsm8k-train-embedded-v6.jsonl"
# The former embedded default (before the 1.5B ladder): its router, kept for this comparison, and its tiers.
V6_ROUTER = REPO / "models/routers/embedded-gsm8k-v6"
V6_TIERS = [("smollm2-135m", 1, 1, 0.3, 2, 1), ("qwen2.5-coder-0.5b", 1, 1, 0.3, 2, 1),
            ("qwen2.5-coder-0.5b-reason", 4, 2, 0.3, 2, 1)]  # name, N, M, alpha, beta, score every
# The embedded default's ladder and router (models/outcomes/gsm8k-train-embedded-v7.md): the reasoning tier as
# cascade/engines/embedded.toml runs it.
V7 = REPO / "models/outcomes/gsm8k-train-embedded-v7.jsonl"
V7_ROUTER = REPO / "models/routers/embedded-gsm8k-v7"
V7_TIERS = [("smollm2-135m", 1, 1, 0.3, 2, 1), ("qwen2.5-coder-0.5b", 1, 1, 0.3, 2, 1),
            ("qwen2.5-coder-1.5b", 1, 1, 0.3, 2, 1), ("qwen2.5-coder-1.5b-reason", 8, 2, 0.5, 4, 2)]
QWEN15 = REPO / "models/outcomes/qwen15-train-bench"
NEVER = 1.01  # above any routing score


class Tier(msgspec.Struct, frozen=True):
    name: str
    toml: str  # its branch settings, as [[tiers]] lines
    branches: int = 1


class Ladder(msgspec.Struct):
    name: str
    tiers: list[Tier]
    routing: str  # [routing] policy lines
    prompts: list[Any]  # cascade.data Prompt
    answers: dict[str, list[list[tuple[str, int]]]]  # question -> per tier: its (answer, tokens) per branch
    scores: dict[str, float]  # question -> routing score
    upper: float  # the thresholds above the swept one (v6: the reasoning tier's, which `balanced` never reaches)
    balanced: list[float]
    accuracy: list[float]  # each tier's labelled accuracy on these questions (a vote: its majority's)
    sources: list[Path]  # the labelled outcomes read
    swept: int = 0  # the threshold the static sweep moves: the share above it is the swept share
    fast: list[float] | None = None  # `fast`, where load-reactive routing moves requests (None: the cheapest tier)


def qwen15_ladder() -> Ladder:
    greedy = {r["id"]: r for r in map(json.loads, (QWEN15 / "greedy/requests.jsonl").read_text().splitlines())}
    voted = {row.id: row.tiers["qwen2.5-coder-1.5b-reason"].branches or [] for _, row in
             read_rows(QWEN15 / "sc-t07/branches.jsonl")}
    by_id = {p.id: p for p in load("gsm8k-train")}
    prompts = [by_id[i] for i in voted if i in greedy]
    direct = {p.id: (reference_answer(p.reference) if greedy[p.id]["correct"] else "none",
                     greedy[p.id]["decode_tokens"]) for p in prompts}
    answers = {p.prompt: [[direct[p.id]], [(b.answer or "none", b.output_tokens or 8) for b in voted[p.id]]]
               for p in prompts}
    scores = {p.prompt: heuristic_difficulty(p.prompt) for p in prompts}
    # The vote's answer as the gateway picks it: the most frequent; a tie goes to the shortest branch.
    majority = [max(voted[p.id], key=lambda b: (sum(o.answer == b.answer for o in voted[p.id]),
                                                -(b.output_tokens or 0))).correct for p in prompts]
    accuracy = [float(np.mean([greedy[p.id]["correct"] for p in prompts])), float(np.mean(majority))]
    reason = "branches = {{ n = 8, m = 8, slots = {slots} }}\nscorer = \"none\""
    return Ladder("qwen15", [Tier("qwen2.5-coder-1.5b", ""), Tier("qwen2.5-coder-1.5b-reason", reason, 8)],
                  'policy = "heuristic"', prompts, answers, scores, upper=NEVER,
                  balanced=[float(np.median(list(scores.values())))], accuracy=accuracy,
                  sources=[QWEN15 / "greedy/requests.jsonl", QWEN15 / "sc-t07/branches.jsonl"])


def learned_ladder(name: str, outcomes: Path, router: Path, spec: list[tuple[str, int, int, float, int, int]],
                   swept: int, calibrated_fast: bool) -> Ladder:
    """A ladder of labelled outcomes (one answer per tier; a vote's branches all answer as its label did) routed by
    the router trained on them, at its calibrated `balanced`."""
    names = [t[0] for t in spec]
    rows = [row for _, row in read_rows(outcomes)]
    by_id = {p.id: p for p in load("gsm8k-train")}
    prompts = [by_id[row.id] for row in rows]
    answers = {by_id[row.id].prompt: [[(o.answer if isinstance(o.answer, str) else "none", o.output_tokens or 8)]
                                      for o in (row.tiers[n] for n in names)] for row in rows}
    signal = LearnedSignal.load(str(router), names)
    scores = {p.prompt: signal.assess(p.prompt).score for p in prompts}
    tiers = [Tier(tier, f"branches = {{{{ n = {n}, m = {m}, alpha = {alpha}, beta = {beta}, k = {every}, "
                        f"slots = {{slots}} }}}}", n)
             for tier, n, m, alpha, beta, every in spec]
    points = signal.operating_points()
    balanced = points["balanced"]
    accuracy = [float(np.mean([bool(row.tiers[n].correct) for row in rows])) for n in names]
    return Ladder(name, tiers, f'policy = "learned"\nrouter = "{router}"', prompts, answers, scores,
                  upper=balanced[swept + 1] if swept + 1 < len(balanced) else NEVER, balanced=balanced,
                  accuracy=accuracy, sources=[outcomes], swept=swept,
                  fast=points["fast"] if calibrated_fast else None)


def v6_ladder() -> Ladder:
    return learned_ladder("v6", V6, V6_ROUTER, V6_TIERS, swept=0, calibrated_fast=False)


def v7_ladder() -> Ladder:
    return learned_ladder("v7", V7, V7_ROUTER, V7_TIERS, swept=1, calibrated_fast=True)


def thresholds(ladder: Ladder, share: float) -> list[float]:
    """Static thresholds that send `share` of the questions above the swept threshold (the thresholds above it as
    `balanced` has them; those below it no higher than it)."""
    cut = min(float(np.quantile(list(ladder.scores.values()), 1.0 - share)) if share < 1 else 0.0, ladder.upper)
    return [min(x, cut) if i < ladder.swept else cut if i == ladder.swept else x
            for i, x in enumerate(ladder.balanced)]


def tier_shares(ladder: Ladder, points: list[float]) -> list[float]:
    picks = np.searchsorted(points, list(ladder.scores.values()), side="right")
    return [round(float(np.mean(picks == t)), 3) for t in range(len(ladder.tiers))]


def hook(ladder: Ladder, tier: int, scale: int) -> ScriptHook:
    def script(base: FakeScript, body: dict[str, Any]) -> FakeScript:
        branches = ladder.answers[body["messages"][-1]["content"]][tier]
        answer, tokens = branches[int(body.get("seed") or 0) % len(branches)]
        words = max(4, round(tokens / scale))
        return msgspec.structs.replace(base, answer=" ".join(["step"] * (words - 4) + ["The", "answer", "is",
                                                                                        f"{answer}."]))
    return script


def capacity(ladder: Ladder, speeds: list[tuple[float, float, int]], full_x: float) -> tuple[list[int], float]:
    """Each tier's capacity in requests, and the rate (req/s) at which `balanced` fills its busiest tier."""
    caps = [int(slots) // t.branches for t, (_, _, slots) in zip(ladder.tiers, speeds, strict=True)]
    shares = tier_shares(ladder, ladder.balanced)
    rates = []
    for t, ((ttft, itl, _), cap, share) in enumerate(zip(speeds, caps, shares, strict=True)):
        if share:
            tokens = np.mean([max(n for _, n in per_tier[t]) for per_tier in ladder.answers.values()])
            rates.append(cap / ((ttft + itl * full_x * tokens) / 1000) / share)
    return caps, round(min(rates), 3)


def gateway_toml(ladder: Ladder, urls: list[str], slots: list[int], points: list[float], caps: list[int] | None,
                 reactive: str, slo: dict[str, float]) -> str:
    """The arm's config; `reactive`: "" (off), "slo" (the SLO and the capacities) or "capacity" (capacities only)."""
    slo = slo if reactive != "capacity" else {}
    lines = []
    for i, (tier, url) in enumerate(zip(ladder.tiers, urls, strict=True)):
        lines += ["[[tiers]]", f'name = "{tier.name}"', "default_max_tokens = 512",
                  tier.toml.format(slots=slots[i]), *([f"max_in_flight = {caps[i]}"] if caps else []),
                  f'backends = [{{ kind = "openai", url = "{url}", model = "{tier.name}" }}]', ""]
    fast = ladder.fast or [NEVER] * (len(ladder.tiers) - 1)
    lines += ["[routing]", ladder.routing, f"operating_points = {{ balanced = {points}, fast = {fast} }}", "",
              "[routing.load]", f"enabled = {str(bool(reactive)).lower()}", f"ttft_ms = {slo.get('ttft_ms', 0)}",
              f"e2el_ms = {slo.get('e2el_ms', 0)}", "window_s = 3.0", "hold_s = 2.0"]
    if reactive and caps:
        lines.append("max_in_flight = { " + ", ".join(f'"{t.name}" = {c}' for t, c in zip(ladder.tiers, caps,
                                                                                      strict=True)) + " }")
    return "\n".join(line for line in lines if line) + "\n"


def segments(seeds: int, loads: list[float], nominal: float, segment_s: float, gap_s: float, drain: bool
             ) -> list[tuple[int, float, float, list[float]]]:
    """(seed, load, start, arrival offsets) of every segment; the arrivals depend on seed and load only."""
    out, start = [], 0.0
    for seed in range(seeds):
        for k, load_x in enumerate(loads):
            rng = np.random.default_rng([seed, k])
            times = np.cumsum(rng.exponential(1 / (load_x * nominal), size=int(load_x * nominal * segment_s * 3)))
            out.append((seed, load_x, start, [start + t for t in times[times < segment_s]]))
            start += segment_s + gap_s + (1.5 * max(0.0, load_x - 1) * segment_s if drain else 0.0)
    return out


def run_arm(tmp: Path, name: str, toml: str, segs: list[Any], dataset: str, args: argparse.Namespace,
            tier_names: list[str]) -> dict[str, Any]:
    trace = tmp / f"{name}.csv"
    offsets = [t for *_, times in segs for t in times]
    trace.write_text("Timestamp,Request tokens,Response tokens\n" + "".join(f"{t:.4f},64,512\n" for t in offsets))
    started = time.monotonic()
    with serve_config(tmp, toml, within_s=120) as served:
        out = tmp / f"run-{name}"
        cmd = [*CASCADE, "loadgen", "--url", served.url, "--dataset", dataset, "--arrival", "trace", "--trace",
               str(trace), "--n", str(len(offsets)), "--slo", args.slo, "--quality-mix", "balanced=1.0",
               "--seed", "0", "--timeout-s", "30", "--no-progress", "--out", str(out), "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=offsets[-1] + 600)
        if done.returncode != 0:
            raise RuntimeError(f"loadgen failed: {done.stderr[-2000:]}")
        lag = json.loads(done.stdout).get("dispatch_lag_ms")
        text = httpx.get(f"{served.url}/metrics", timeout=10).text
        degraded = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("cascade_degraded_requests_total{"))
    records = sorted(read_request_records(out), key=lambda r: r.index)
    rows, i = [], 0
    for seed, load_x, _, times in segs:
        group, i = records[i:i + len(times)], i + len(times)
        n = len(group)
        rows.append({"seed": seed, "load_x": load_x, "requests": n,
                     "correct_goodput_rps": round(sum(bool(r.correct and r.meets_slo) for r in group)
                                                  / args.segment_s, 4),
                     "slo_attainment": round(sum(bool(r.meets_slo) for r in group) / max(1, n), 4),
                     "accuracy": round(sum(bool(r.correct) for r in group) / max(1, n), 4),
                     # 429: before the stream (HTTP) or in it (a vote's stream starts before its tier admits it)
                     "rejected_429": sum(r.status == 429 or "limit" in (r.error or "") for r in group),
                     "failed": sum(r.error is not None for r in group),
                     "tier_share": [round(sum(r.tier == t for r in group) / max(1, n), 3) for t in tier_names]})
    return {"wall_s": round(time.monotonic() - started, 1), "degraded_requests": int(degraded),
            "dispatch_lag_ms": lag, "segments": rows}


def paired(a: list[float], b: list[float], rng: np.random.Generator) -> dict[str, Any]:
    """a against b, paired by seed: mean per-seed ratio with a t 95% interval; bootstrap of the ratio of means."""
    x, y = np.array(a), np.maximum(np.array(b), 1e-9)
    ratios = x / y
    half = float(stats.t.ppf(0.975, len(x) - 1) * ratios.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0
    picks = rng.integers(0, len(x), size=(10_000, len(x)))
    boot = x[picks].mean(axis=1) / y[picks].mean(axis=1)
    return {"mean_ratio": round(float(ratios.mean()), 3),
            "t95": [round(float(ratios.mean()) - half, 3), round(float(ratios.mean()) + half, 3)],
            "ratio_of_means": round(float(x.mean() / y.mean()), 3),
            "bootstrap95": [round(float(v), 3) for v in np.percentile(boot, [2.5, 97.5])],
            "diff_rps": round(float((x - np.array(b)).mean()), 3)}


def mean_t(values: list[float]) -> dict[str, Any]:
    x = np.array(values)
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0
    return {"mean": round(float(x.mean()), 3), "t95": [round(float(x.mean()) - half, 3),
                                                       round(float(x.mean()) + half, 3)]}


def by_load(arms: dict[str, Any], loads: list[float], seed: int) -> dict[str, Any]:
    """Per load: each arm's correct goodput over the seeds, the best capped static point, and each reactive arm
    against `static`, `static_capped` and `static_best`, paired by seed."""
    rng = np.random.default_rng(seed)
    capped = [a for a in arms if a == "static_capped" or a.startswith("capped@")]
    out = {}
    for load_x in loads:
        segs = {arm: [s for s in run["segments"] if s["load_x"] == load_x] for arm, run in arms.items()}
        goodput = {arm: [s["correct_goodput_rps"] for s in rows] for arm, rows in segs.items()}
        best = max(capped, key=lambda a: float(np.mean(goodput[a]))) if capped else None
        entry: dict[str, Any] = {"static_best": best, "arms": {
            arm: {"correct_goodput_rps": mean_t(goodput[arm]),
                  **{key: round(float(np.mean([s[key] for s in rows])), 3)
                     for key in ("slo_attainment", "accuracy", "requests")},
                  "rejected_429_share": round(sum(s["rejected_429"] for s in rows)
                                              / max(1, sum(s["requests"] for s in rows)), 3),
                  "tier_share": [round(float(np.mean(col)), 3) for col in zip(*(s["tier_share"] for s in rows),
                                                                              strict=True)]}
            for arm, rows in segs.items()}}
        if best is not None:
            goodput["static_best"] = goodput[best]
        for arm in ("reactive", "reactive_capacity"):
            if arm in goodput:
                entry[f"{arm}_vs"] = {other: paired(goodput[arm], goodput[other], rng)
                                      for other in ("static", "static_capped", "static_best") if other in goodput}
        out[f"{load_x:g}x"] = entry
    return out


def run_ladder(tmp: Path, ladder: Ladder, args: argparse.Namespace, speeds: list[tuple[float, float, int]],
               shares: list[float]) -> dict[str, Any]:
    full, nominal = capacity(ladder, speeds, args.full_batch_x)
    caps = [max(1, round(c * args.cap_x)) for c in full]  # the per-tier limits of the capped and reactive arms
    slots = [int(n) for *_, n in speeds]
    plan: dict[str, tuple[list[float], list[int] | None, str]] = {
        "static": (ladder.balanced, None, ""), "static_capped": (ladder.balanced, caps, ""),
        **{f"capped@{s:g}": (thresholds(ladder, s), caps, "") for s in shares},
        "reactive": (ladder.balanced, caps, "slo"), "reactive_capacity": (ladder.balanced, caps, "capacity")}
    if args.arms:
        plan = {arm: value for arm, value in plan.items() if arm in args.arms.split(",")}
    names = [t.name for t in ladder.tiers]
    result: dict[str, Any] = {
        "tiers": names, "labelled_accuracy": [round(a, 3) for a in ladder.accuracy],
        "questions": len(ladder.prompts),
        "labels": {str(f.relative_to(REPO)): hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in ladder.sources},
        "speeds": [f"{a:g}/{b:g}/{c}" for a, b, c in speeds],
        "capacity_requests": full, "max_in_flight": caps, "nominal_rps": nominal,
        "points": {arm: {"thresholds": [round(x, 4) for x in points], "tier_share": tier_shares(ladder, points)}
                   for arm, (points, _, _) in plan.items()}, "arms": {}}
    dataset = tmp / f"{ladder.name}.jsonl"
    dataset.write_bytes(b"".join(msgspec.json.encode({"id": p.id, "prompt": p.prompt, "reference": p.reference})
                                 + b"\n" for p in ladder.prompts))
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_asgi(FakeEngine(
            FakeScript(ttft_ms=ttft, itl_ms=itl * args.token_scale), max_running=n,
            hook=hook(ladder, t, args.token_scale), itl_batch_slope=(args.full_batch_x - 1) / max(1, n - 1))))
            for t, (ttft, itl, n) in enumerate(speeds)]
        for arm, (points, arm_caps, reactive) in plan.items():
            segs = segments(args.seeds, args.loads, nominal, args.segment_s, args.gap_s, drain=arm_caps is None)
            print(f"{ladder.name} {arm}: {sum(len(s[3]) for s in segs)} requests over {segs[-1][2]:.0f} s",
                  file=sys.stderr)
            toml = gateway_toml(ladder, urls, slots, points, arm_caps, reactive, args.slo_ms)
            result["arms"][arm] = run_arm(tmp, f"{ladder.name}-{arm}", toml, segs, str(dataset), args, names)
    result["by_load"] = by_load(result["arms"], args.loads, args.seed)
    return result


def plot(result: dict[str, Any], path: str) -> None:
    """Per ladder: each arm's correct goodput against load (top), and `reactive`'s paired ratio to each baseline
    with its bootstrap 95% interval (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ladders = result["ladders"]
    fig, axes = plt.subplots(2, len(ladders), figsize=(6.5 * len(ladders), 8), squeeze=False)
    for col, (name, ladder) in enumerate(ladders.items()):
        loads = list(ladder["by_load"])
        x = np.array([float(k.rstrip("x")) for k in loads])
        top, bottom = axes[0][col], axes[1][col]
        for k, (arm, style) in enumerate((("static", "-o"), ("static_capped", "-^"), ("static_best", "-s"),
                                          ("reactive", "-D"), ("reactive_capacity", "-v"))):
            entries = [ladder["by_load"][key] for key in loads]
            rows = [e["arms"].get(e["static_best"] if arm == "static_best" else arm) for e in entries]
            if any(r is None for r in rows):
                continue
            mean = np.array([r["correct_goodput_rps"]["mean"] for r in rows])
            low, high = (np.array([r["correct_goodput_rps"]["t95"][i] for r in rows]) for i in (0, 1))
            top.errorbar(x + (k - 1.5) * 0.02, mean, yerr=[mean - low, high - mean], fmt=style, capsize=3, ms=4,
                         label=arm)
            versus = [e.get("reactive_vs", {}).get(arm) for e in entries]
            if not arm.startswith("reactive") and all(v is not None for v in versus):
                ratio = np.array([v["ratio_of_means"] for v in versus])
                lo, hi = (np.array([v["bootstrap95"][i] for v in versus]) for i in (0, 1))
                bottom.errorbar(x + (k - 1) * 0.02, ratio, yerr=[ratio - lo, hi - ratio], fmt=style, capsize=3,
                                ms=4, label=f"reactive / {arm}")
        accuracy = ", ".join(f"{a:.2f}" for a in ladder["labelled_accuracy"])
        top.set_title(f"{name}: tiers' accuracy {accuracy}; 1x = {ladder['nominal_rps']} req/s; "
                      f"max_in_flight {ladder['max_in_flight']}", fontsize=9)
        top.set_ylabel("correct-within-SLO goodput (req/s), t 95%")
        bottom.axhline(1.0, color="0.5", lw=1)
        bottom.set_ylabel("ratio of mean goodputs, paired bootstrap 95%")
        for ax in (top, bottom):
            ax.set_xlabel("offered load (x capacity)")
            ax.set_xticks(x)
            ax.grid(alpha=0.3)
            ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Load-reactive vs static baselines, {result['seeds']} seeds per arm and load;\nstatic_best = the "
                 "best capped static threshold at each load (an oracle)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def speeds_arg(text: str) -> list[tuple[float, float, int]]:
    return [(float(a), float(b), int(c)) for a, b, c in (s.split("/") for s in text.split(","))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ladders", default="qwen15,v6")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 1.5, 2.0])
    parser.add_argument("--segment-s", type=float, default=5.0)
    parser.add_argument("--gap-s", type=float, default=2.0, help="pause after a segment (static: plus its queue's)")
    parser.add_argument("--qwen15-speeds", type=speeds_arg, default=speeds_arg("50/2/8,50/2/32"))
    parser.add_argument("--v6-speeds", type=speeds_arg, default=speeds_arg("20/1/32,50/2/8,50/2/32"))
    parser.add_argument("--qwen15-shares", type=lambda s: [float(x) for x in s.split(",")], default=[0.25, 0.35],
                        help="static points to sweep besides `balanced`: shares sent to the upper tier")
    parser.add_argument("--v6-shares", type=lambda s: [float(x) for x in s.split(",")], default=[0.85, 1.0])
    parser.add_argument("--v7-speeds", type=speeds_arg, default=speeds_arg("20/0.5/32,50/1/16,50/2/8,50/2/32"))
    parser.add_argument("--v7-shares", type=lambda s: [float(x) for x in s.split(",")], default=[0.6, 0.75])
    parser.add_argument("--full-batch-x", type=float, default=2.0, help="ITL at a full batch / ITL alone")
    parser.add_argument("--cap-x", type=float, default=1.0,
                        help="max_in_flight = this x a tier's capacity (its batch slots / branches)")
    parser.add_argument("--token-scale", type=int, default=16, help="labelled tokens per streamed chunk")
    parser.add_argument("--slo", default="e2el_ms=2500", help="a vote's first token is its answer: E2E only")
    parser.add_argument("--arms", default="", help="arms to run, comma-separated (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument("--note", default="", help="the machine's state, for the JSON (e.g. what else runs)")
    parser.add_argument("--plot", default="")
    parser.add_argument("--out", "--json-out", dest="out", default="")
    args = parser.parse_args(argv)
    args.slo_ms = {k: float(v) for k, v in (item.split("=") for item in args.slo.split(","))}
    builders = {"qwen15": qwen15_ladder, "v6": v6_ladder, "v7": v7_ladder}
    result: dict[str, Any] = {
        "seeds": args.seeds, "loads_x": args.loads, "segment_s": args.segment_s, "slo": args.slo_ms,
        "full_batch_itl_x": args.full_batch_x, "token_scale": args.token_scale, "cap_x": args.cap_x,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in os.getloadavg()],
                    "note": args.note}, "ladders": {}}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="load-reactive-fair-") as tmp_dir:
        for name in args.ladders.split(","):
            speeds, shares = getattr(args, f"{name}_speeds"), getattr(args, f"{name}_shares")
            result["ladders"][name] = run_ladder(Path(tmp_dir), builders[name](), args, speeds, shares)
    result["machine"] |= {"loadavg_after": [round(x, 2) for x in os.getloadavg()],
                          "wall_s": round(time.monotonic() - started, 1)}
    print_result(result, args.out, indent=1)
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
