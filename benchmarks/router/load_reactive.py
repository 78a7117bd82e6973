"""Load-reactive operating points against static thresholds, on a rate ramp to 2x the nominal rate. Prints JSON.

Method
  * The embedded default's ladder (its tier names, branch settings, learned router and operating points)
    on fake engines, one per tier, in this process on free 127.0.0.1 ports. Each engine answers a GSM8K
    training question with the answer and output length its model gave in the labelled outcomes
    (models/outcomes/gsm8k-train-embedded-v8.jsonl): accuracy is the real models', speed is scripted
    (`--speeds`: TTFT ms / ms per token / batch slots per tier), so a tier is at capacity when its batch slots
    are full and further requests queue for their first token, as on SGLang.
  * The questions: the outcome rows, text and reference read in place from ../shared/data/gsm8k/train.jsonl
    into a temporary dataset file (never kept).
  * The ramp: seeded Poisson arrivals whose rate steps through `--steps` x `--rate` (the nominal rate, at
    which `balanced` keeps every tier within its SLO), `--phase-s` seconds each, written as a trace, sent by one
    `cascade loadgen --arrival trace` run (streamed, `--quality-mix`) per arm against a fresh `cascade serve`:
    `static` (routing as configured), `reactive_latency` (`[routing.load] enabled` with the SLO below: latency
    only) and `reactive` (the same plus `max_in_flight` = the direct tiers' engine batch slots); everything else
    identical, same arrivals, same questions.
  * SLO: `--slo` (loadgen's, also the gateway's `[routing.load]` ttft_ms / e2el_ms).
  * `--embedded`: the same ramp on the embedded default itself (`cascade serve`'s own config with a
    `[routing.load]` table appended: real models on CPU, answering GSM8K test questions, `--max-tokens` per
    answer); arms `static` and `reactive_latency`, and `reactive` with `--max-in-flight tier=N,...` (the
    requests a CPU worker answers within the SLO, which the operator has to measure). `--arms` picks arms.

Reported per arm, per step and per `--bin-s` window of send time: requests, SLO attainment, accuracy, goodput
and correct goodput (graded correct AND within every SLO, per second), each tier's share; per arm the
gateway's degraded-request count, and the run's share of requests served degraded. `--plot FILE.png` draws
the three over time, both arms overlaid, with the offered rate.
Usage: .venv/bin/python -m benchmarks.router.load_reactive [--rate 2.0] [--phase-s 60] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
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

from cascade.config import load_config
from cascade.data.datasets import load
from cascade.data.outcomes import read_rows
from cascade.data.records import RequestRecord, read_request_records
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript, ScriptHook
from cascade.testing.processes import CASCADE
from cascade.testing.scripts import print_result
from cascade.testing.servers import serve_config

REPO = Path(__file__).resolve().parents[2]
OUTCOMES = REPO / "models/outcomes/gsm8k-train-embedded-v8.jsonl"
EMBEDDED = REPO / "cascade/engines/embedded.toml"


class Labelled:
    """Each question's labelled answer per tier: (answer text, output tokens)."""

    def __init__(self, tier_names: list[str]) -> None:
        rows = [row for _, row in read_rows(OUTCOMES)]
        prompts = {p.id: p for p in load("gsm8k-train")}
        self.items = [prompts[row.id] for row in rows]
        self.by_text: dict[str, dict[str, tuple[str, int]]] = {}
        for row in rows:
            per_tier = {}
            for name in tier_names:
                outcome = row.tiers[name]
                answer = outcome.answer if isinstance(outcome.answer, str) else "none"
                per_tier[name] = (answer, max(8, outcome.output_tokens or 8))
            self.by_text[prompts[row.id].prompt] = per_tier

    def write_dataset(self, path: Path) -> None:
        with path.open("wb") as out:
            for p in self.items:
                out.write(msgspec.json.encode({"id": p.id, "prompt": p.prompt, "reference": p.reference}) + b"\n")

    def hook(self, tier: str) -> ScriptHook:
        def script(base: FakeScript, body: dict[str, Any]) -> FakeScript:
            text = body["messages"][-1]["content"]
            answer, tokens = self.by_text[text][tier]
            words = ["step"] * (tokens - 4) + ["The", "answer", "is", f"{answer}."]
            return msgspec.structs.replace(base, answer=" ".join(words))
        return script


def ramp_trace(path: Path, rates: list[float], phase_s: float, seed: int) -> int:
    rng = np.random.default_rng(seed)
    times: list[float] = []
    for k, rate in enumerate(rates):
        t = k * phase_s
        while (t := t + rng.exponential(1.0 / rate)) < (k + 1) * phase_s:
            times.append(t)
    path.write_text("Timestamp,Request tokens,Response tokens\n" + "".join(f"{t:.4f},64,512\n" for t in times))
    return len(times)


ARMS = ("static", "reactive_latency", "reactive")


def gateway_toml(engines: list[str], slo: dict[str, float], arm: str, slots: dict[str, int]) -> str:
    config = load_config(EMBEDDED)
    lines = []
    for tier, url in zip(config.tiers, engines, strict=True):
        b = tier.branches
        lines += ["[[tiers]]", f'name = "{tier.name}"', f"default_max_tokens = {tier.default_max_tokens}",
                  f"branches = {{ n = {b.n}, m = {b.m}, alpha = {b.alpha}, beta = {b.beta}, k = {b.k}, "
                  f"slots = {b.slots} }}",
                  f'backends = [{{ kind = "openai", url = "{url}", model = "{tier.name}" }}]', ""]
    points = ", ".join(f"{k} = {v}" for k, v in config.routing.operating_points.items())
    lines += ["[routing]", f'policy = "{config.routing.policy}"', f'router = "{config.routing.router}"',
              f"operating_points = {{ {points} }}", "", "[routing.load]", f"enabled = {str(arm != 'static').lower()}",
              f"ttft_ms = {slo.get('ttft_ms', 0)}", f"e2el_ms = {slo.get('e2el_ms', 0)}"]
    if arm == "reactive":  # the direct tiers' capacity is their engines' batch slots
        lines.append(max_in_flight_line(slots))
    return "\n".join(lines) + "\n"


def embedded_toml(slo: dict[str, float], arm: str, capacity: dict[str, int] | None = None) -> str:
    """The embedded default's config as `cascade serve` runs it, with the arm's [routing.load] table
    (`reactive`: plus `max_in_flight` = `capacity`, the requests a CPU worker answers within the SLO)."""
    router = str((EMBEDDED.parent / load_config(EMBEDDED).routing.router).resolve())
    text = EMBEDDED.read_text().replace('router = "../../models/routers/embedded-gsm8k"', f'router = "{router}"')
    text = text.replace('traffic_log = "logs/traffic.jsonl"', 'traffic_log = ""')
    text += (f"\n[routing.load]\nenabled = {str(arm != 'static').lower()}\n"
             f"ttft_ms = {slo.get('ttft_ms', 0)}\ne2el_ms = {slo.get('e2el_ms', 0)}\n")
    if arm == "reactive" and capacity:
        text += max_in_flight_line(capacity) + "\n"
    return text


def max_in_flight_line(capacity: dict[str, int]) -> str:
    return "max_in_flight = { " + ", ".join(f'"{name}" = {n}' for name, n in capacity.items()) + " }"


def metric_sum(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def summarize(records: list[RequestRecord], start_s: float, end_s: float, tier_names: list[str]) -> dict[str, Any]:
    group = [r for r in records if start_s <= r.scheduled_s < end_s]
    span = end_s - start_s
    n = len(group)
    ok_slo = sum(bool(r.meets_slo) for r in group)
    correct = sum(bool(r.correct) for r in group)
    both = sum(bool(r.meets_slo and r.correct) for r in group)
    return {
        "from_s": round(start_s, 1), "to_s": round(end_s, 1), "requests": n,
        "offered_rps": round(n / span, 3),
        "slo_attainment": round(ok_slo / n, 4) if n else None,
        "accuracy": round(correct / n, 4) if n else None,
        "goodput_rps": round(ok_slo / span, 4),
        "correct_goodput_rps": round(both / span, 4),
        "tier_share": {t: round(sum(r.tier == t for r in group) / n, 3) if n else None for t in tier_names},
        "failed": sum(r.error is not None for r in group),
    }


def run_arm(tmp: Path, name: str, engines: list[str], dataset: str, trace: Path, args: argparse.Namespace,
            slo: dict[str, float], tier_names: list[str]) -> dict[str, Any]:
    slots = {t: int(s.split("/")[2]) for t, s in zip(tier_names[:2], args.speeds.split(","), strict=False)}
    toml = embedded_toml(slo, name, args.max_in_flight) if args.embedded else gateway_toml(engines, slo, name, slots)
    with serve_config(tmp, toml, within_s=600) as served:
        url = served.url
        if args.embedded:  # the workers report ready before their first batch: warm each tier once
            for tier in tier_names[:2]:
                httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
                    "model": tier, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
        out = tmp / f"run-{name}"
        cmd = [*CASCADE, "loadgen", "--url", url, "--dataset", dataset, "--arrival", "trace",
               "--trace", str(trace), "--n", str(args.requests), "--slo", args.slo, "--quality-mix", args.quality_mix,
               "--seed", str(args.seed), "--timeout-s", str(args.timeout_s), "--no-progress", "--out", str(out),
               "--json", *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else [])]
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=len(args.steps) * args.phase_s + args.timeout_s + 600)
        if done.returncode != 0:
            raise RuntimeError(f"loadgen failed: {done.stderr[-2000:]}")
        summary = json.loads(done.stdout)
        degraded = metric_sum(url, "cascade_degraded_requests_total")
    records = read_request_records(out)
    steps = [summarize(records, k * args.phase_s, (k + 1) * args.phase_s, tier_names) | {"rate_x": x}
             for k, x in enumerate(args.steps)]
    total_s = len(args.steps) * args.phase_s
    bins = [summarize(records, t, t + args.bin_s, tier_names) for t in np.arange(0, total_s, args.bin_s)]
    return {"wall_s": round(time.monotonic() - started, 1), "overall": summarize(records, 0, total_s, tier_names),
            "degraded_requests": int(degraded), "degraded_share": round(degraded / max(1, len(records)), 4),
            "loadgen_correct_goodput_rps": summary.get("correct_goodput_rps"), "steps": steps, "bins": bins}


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("slo_attainment", "SLO attainment"), ("accuracy", "accuracy"),
              ("correct_goodput_rps", "correct-within-SLO goodput (req/s)"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for arm, style in zip(result["arms"], ("-o", "-^", "-s"), strict=False):
            bins = result["arms"][arm]["bins"]
            ax.plot([(b["from_s"] + b["to_s"]) / 2 for b in bins], [b[key] for b in bins], style, ms=3, label=arm)
        rate = result["arms"]["static"]["bins"]
        twin = ax.twinx()
        twin.step([b["from_s"] for b in rate], [b["offered_rps"] for b in rate], where="post", color="0.7", lw=1)
        twin.set_ylabel("offered req/s", color="0.5")
        ax.set_xlabel("send time (s)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower left")
    fig.suptitle(f"Rate ramp {' / '.join(f'{x:g}x' for x in result['steps_x'])} of {result['nominal_rps']} req/s: "
                 "static thresholds vs load-reactive operating points")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1.5, help="nominal rate (req/s): 1x of the ramp")
    parser.add_argument("--steps", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1.0, 1.5, 2.0],
                        help="ramp steps as multiples of --rate")
    parser.add_argument("--phase-s", type=float, default=45.0)
    parser.add_argument("--bin-s", type=float, default=10.0)
    parser.add_argument("--speeds", default="20/3/32,50/7/4,80/12/4,80/12/32",
                        help="per tier TTFT ms / ms per token / batch slots")
    parser.add_argument("--slo", default="ttft_ms=1000,e2el_ms=5000")
    parser.add_argument("--quality-mix", default="balanced=1.0")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embedded", action="store_true", help="ramp the embedded default (real CPU models)")
    parser.add_argument("--max-tokens", type=int, default=0, help="max output tokens per request (0: the tier's)")
    parser.add_argument("--max-in-flight", type=lambda s: {k: int(v) for k, v in (i.split("=") for i in s.split(","))},
                        default=None, help="--embedded: also the `reactive` arm, with these tiers' capacity in "
                        "requests (e.g. qwen2.5-coder-0.5b=2)")
    parser.add_argument("--arms", default="", help="arms to run, comma-separated (default: all that apply)")
    parser.add_argument("--plot", default="")
    parser.add_argument("--out", "--json-out", dest="out", default="")
    args = parser.parse_args(argv)
    slo = {k: float(v) for k, v in (item.split("=") for item in args.slo.split(","))}
    tier_names = [t.name for t in load_config(EMBEDDED).tiers]
    speeds = [tuple(float(x) for x in s.split("/")) for s in args.speeds.split(",")]
    arms: tuple[str, ...] = ARMS if not args.embedded or args.max_in_flight else ARMS[:2]
    if args.arms:
        unknown = set(args.arms.split(",")) - set(arms)
        if "static" not in args.arms.split(","):
            print("load_reactive: --arms needs `static`, the arm every other is compared with", file=sys.stderr)
            return 2
        if unknown:
            print(f"load_reactive: unknown or inapplicable arm(s) {', '.join(sorted(unknown))}; these apply: "
                  f"{', '.join(arms)}", file=sys.stderr)
            return 2
        arms = tuple(a for a in arms if a in args.arms.split(","))
    with tempfile.TemporaryDirectory(prefix="load-reactive-") as tmp_dir, ExitStack() as stack:
        tmp = Path(tmp_dir)
        trace = tmp / "ramp.csv"
        engines: list[str] = []
        dataset = "gsm8k"  # the embedded default: real models on unseen GSM8K test questions
        if not args.embedded:
            labelled = Labelled(tier_names)
            engines = [stack.enter_context(serve_asgi(FakeEngine(FakeScript(ttft_ms=ttft, itl_ms=itl),
                                                                 max_running=int(slots), hook=labelled.hook(name))))
                       for name, (ttft, itl, slots) in zip(tier_names, speeds, strict=True)]
            dataset = str(tmp / "questions.jsonl")
            labelled.write_dataset(Path(dataset))
        n = args.requests = ramp_trace(trace, [x * args.rate for x in args.steps], args.phase_s, args.seed)
        result: dict[str, Any] = {
            "nominal_rps": args.rate, "steps_x": args.steps, "phase_s": args.phase_s, "requests": n,
            "engines": "embedded default (real CPU models)" if args.embedded else "fake, labelled answers",
            "speeds": None if args.embedded else dict(zip(tier_names, args.speeds.split(","), strict=True)),
            "slo": slo, "max_tokens": args.max_tokens or None,
            "quality_mix": args.quality_mix, "seed": args.seed, "arms": {}}
        for arm in arms:
            print(f"arm {arm}: {n} requests over {len(args.steps) * args.phase_s:g} s", file=sys.stderr)
            result["arms"][arm] = run_arm(tmp, arm, engines, dataset, trace, args, slo, tier_names)
    def ratio(arm: str, part: str) -> float:
        pick = (lambda a: result["arms"][a]["overall"]) if part == "overall" else (
            lambda a: result["arms"][a]["steps"][-1])
        return round(pick(arm)["correct_goodput_rps"] / max(1e-9, pick("static")["correct_goodput_rps"]), 3)

    result["correct_goodput_vs_static"] = {arm: {"overall": ratio(arm, "overall"), "top_step": ratio(arm, "top")}
                                           for arm in arms if arm != "static"}
    print_result(result, args.out, indent=1)
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
