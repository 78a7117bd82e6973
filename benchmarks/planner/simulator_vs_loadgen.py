"""Does the planner's simulator predict what a real engine does? Profile an engine, load it with
`cascade loadgen`, and compare the measured end-to-end latency with the simulator's prediction.

Target (one of)
  * `--url URL`: a running OpenAI-compatible engine (`--model` if it serves several).
  * `--embedded smollm2|qwen`: that worker of the embedded default, started as `cascade serve` starts
    it (cascade/engines/supervisor.py: `transformers serve --continuous-batching`, its `--cb-num-blocks`,
    a free 127.0.0.1 port, its own process group, killed in `finally` and on parent death). The worker
    log goes to OUT/logs/, not ./logs/, so a gateway running in the same folder keeps its own log.
  * `--fake`: `cascade fake-server` (scripted TTFT and ITL per stream), with a generated dataset whose
    `[fake tokens=N]` directives give a spread of output lengths. The fake does not batch (every stream
    has its own fixed ITL), so it checks the plumbing (timing, token counts, prefill + decode
    composition), not the queueing model.

Method
  1. Profile (`cascade.profiler.fit.measure`, bounded by `--profile-time-limit-s`), or `--profile FILE`.
  2. `cascade loadgen` as a subprocess: seeded Poisson arrivals at `--rate`, `--n` requests, streamed.
  3. Predict from OUT/loadgen/requests.jsonl, with the profile's `ProfileCost`:
     * replay: `simulate` on the run's own send times and measured input/output tokens; p50/p95/mean
       over the same completed requests as the measurement (both start from an idle engine);
     * planner: `replica_percentile` at `--rate` on `workload_sample(600)` of those lengths, from a
       steady-state batch, first 10% skipped: what `cascade optimize plan` computes for a tier;
     * short runs: the p10/p50/p90 of the p95 of 20 simulated runs as long as the measured one (idle
       start, fresh Poisson arrivals). The planner predicts a steady state; a run of a few dozen
       requests rarely reaches it (near saturation it has not filled up; at any load its p95 rests
       on its 2 or 3 slowest requests), so a planner error outside this band is the model's, inside
       it may be the run's. Compare the planner with long runs (n in the hundreds) at a moderate load;
     * own arrivals: the p10/p50/p90 of the p95 of 20 replays with the run's own send times and its
       lengths shuffled. Measured low in the short-run band but inside this one: the run's arrivals
       were calmer than Poisson usually is (the planner is not refuted by that run).
  4. Relative error of each p95 against the measured p95 (the issue's target: within 25%).
     Replay isolates the step-cost and batching model: same arrivals, same lengths.
  5. Engine drift: a profile fitted before a long run need not hold at its end (seen on the embedded
     SmolLM2 worker: its decode step slowed by ~45% over a 50-minute run). So the engine is profiled
     again after the load test (OUT/profile_after.json; `--no-profile-after` skips it), the run is also
     replayed with that profile, and `phases` splits the run into thirds by send order: measured and
     replayed p95 per third, and the median inter-token latency of steps a request decoded *alone*
     (nothing else in flight), a model-free reading of the engine's own speed over the run.
  6. Profile fitted from a load test (`--calibrate-n N`, or `--loadgen-profile FILE`): the batch probe
     starts its B requests together, and on the embedded CPU workers it missed how the engine steps
     under staggered arrivals (SmolLM2 replays were 27-32% low). With --calibrate-n a separate
     calibration load test (N requests, same rate, seed + 1: other questions, other arrivals) runs
     first, `cascade profile --from-loadgen` fits its timings (OUT/profile_loadgen.json), and the
     measured run is also replayed and planned with that held-out profile.
`--from-run OUT` re-analyses a finished run folder (its profile.json, profile_after.json when present,
loadgen/requests.jsonl) without starting anything; give the same target and --rate as the run.

Replica limits (override with `--kv-capacity-tokens`, `--max-batch`, `--max-prefill-tokens`)
  * embedded: KV = `cb_num_blocks` x 256 (transformers 5.x `ContinuousBatchingConfig.page_size`);
    max batch 1024 (its `max_requests_per_batch` fallback); prefill budget the worker's
    `cb_max_batch_tokens` (1024). None of these binds at the rates a CPU worker sustains.
  * fake: unbounded (each stream is independent).
  * url: KV from the profile (SGLang's /get_server_info) else unbounded; max batch 256 and prefill
    budget 16384, the problem.toml tier defaults (SGLang's --max-running-requests, chunked prefill).
Input tokens are the server's `usage.prompt_tokens` when the profile was fitted on them, else the
prompt text's estimate (4 characters a token; the profile's estimate ladder counts a common word as
a token), so the profile's per-token prefill cost applies to the same unit.

Output: one JSON object on stdout (and `--json-out`); progress on stderr. Usage:
  .venv/bin/python -m benchmarks.planner.simulator_vs_loadgen --fake --rate 4 --n 60
  .venv/bin/python -m benchmarks.planner.simulator_vs_loadgen --embedded smollm2 --rate 0.25 --n 100 --max-tokens 128
  .venv/bin/python -m benchmarks.planner.simulator_vs_loadgen --embedded qwen --rate 0.08 --n 60 --max-tokens 128
  .venv/bin/python -m benchmarks.planner.simulator_vs_loadgen --embedded smollm2 --rate 0.12 --n 100 --calibrate-n 60
  .venv/bin/python -m benchmarks.planner.simulator_vs_loadgen --embedded smollm2 --rate 0.12 \
      --from-run runs/simulator_vs_loadgen/smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cascade.config import WorkerConfig
from cascade.data.datasets import estimate_tokens
from cascade.data.records import RequestRecord
from cascade.engines.supervisor import Worker, free_port, wait_healthy, worker_command
from cascade.errors import CascadeError
from cascade.optimizer.parallelism import SimSettings
from cascade.optimizer.profile import UNBOUNDED_KV_TOKENS, Profile, ProfileCost, load_profile, write_profile
from cascade.optimizer.simulator import SimResult, replica_percentile, saturation_rps, simulate, workload_sample
from cascade.profiler.fit import profile_from_records, read_loadgen_records
from cascade.repo_paths import recorded_values
from cascade.testing.scripts import print_result
from loadgen.run import LoadConfig, build_workload

TRANSFORMERS_PAGE_SIZE = 256  # tokens per KV block of `transformers serve --continuous-batching`
TRANSFORMERS_MAX_BATCH = 1024
STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


@dataclass
class Target:
    kind: str
    url: str
    model: str | None
    kv_capacity_tokens: int | None  # None: the profile's, else unbounded
    max_batch: int
    max_prefill_tokens: int
    info: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def started(worker: Worker, timeout_s: float) -> Iterator[Worker]:
    """Start a worker, wait for /health, and always stop its process group."""
    worker.start()
    try:
        asyncio.run(wait_healthy(worker, timeout_s))
        yield worker
    finally:
        worker.stop()


def embedded_worker(name: str) -> WorkerConfig:
    from cascade.engines.embedded import embedded_config

    return next(w for w in embedded_config().workers if w.name == name)


def embedded_limits(config: WorkerConfig) -> dict[str, int]:
    return {"kv_capacity_tokens": config.cb_num_blocks * TRANSFORMERS_PAGE_SIZE, "max_batch": TRANSFORMERS_MAX_BATCH,
            "max_prefill_tokens": config.cb_max_batch_tokens}


def finished_target(args: argparse.Namespace) -> Target:
    """The target's limits for `--from-run`: nothing is started."""
    if args.url:
        return Target("url", args.url.rstrip("/"), args.model, None, 256, 16384)
    if args.embedded:
        config = embedded_worker(args.embedded)
        return Target("embedded", "(finished run)", None, **embedded_limits(config),
                      info={"worker": config.name, "model": config.model, "cb_num_blocks": config.cb_num_blocks,
                            "cb_max_batch_tokens": config.cb_max_batch_tokens})
    return Target("fake", "(finished run)", None, UNBOUNDED_KV_TOKENS, 1 << 20, 1 << 30,
                  {"ttft_ms": args.fake_ttft_ms, "itl_ms": args.fake_itl_ms})


@contextlib.contextmanager
def serve_target(args: argparse.Namespace, out: Path) -> Iterator[Target]:
    if args.url:
        yield Target("url", args.url.rstrip("/"), args.model, None, 256, 16384)
    elif args.embedded:
        from cascade.engines.models import load_card, prepare

        config = embedded_worker(args.embedded)
        worker = Worker(config, prepare(load_card(config.model)), out / "logs")  # as cascade.tiers.build.make_workers
        log(f"starting embedded worker {config.name} ({config.model}); log {worker.log_path}")
        with started(worker, config.startup_timeout_s):
            command = worker_command(worker.model_dir, worker.port, config)
            info = {"worker": config.name, "model": config.model, "cb_num_blocks": config.cb_num_blocks,
                    "cb_max_batch_tokens": config.cb_max_batch_tokens,
                    "pid": worker.process.pid if worker.process else None, "command": command}
            # transformers serve answers any model id with its preloaded model; the gateway sends the dir.
            yield Target("embedded", worker.url, str(worker.model_dir), **embedded_limits(config), info=info)
    else:
        port = free_port()
        command = [sys.executable, "-m", "cascade.cli", "fake-server", "--host", "127.0.0.1", "--port", str(port),
                   "--ttft-ms", str(args.fake_ttft_ms), "--itl-ms", str(args.fake_itl_ms),
                   "--tokens", str(args.max_tokens)]
        worker = Worker(WorkerConfig(name="fake", model="fake", port=port), Path(), out / "logs", command=command,
                        env=dict(os.environ))
        log(f"starting fake engine on port {port}")
        with started(worker, 30.0):
            yield Target("fake", worker.url, None, UNBOUNDED_KV_TOKENS, 1 << 20, 1 << 30,
                         {"ttft_ms": args.fake_ttft_ms, "itl_ms": args.fake_itl_ms})


def get_profile(args: argparse.Namespace, target: Target, out: Path, name: str = "profile.json") -> Profile:
    if args.profile and name == "profile.json":
        log(f"profile: {args.profile}")
        return load_profile(args.profile)
    from cascade.profiler.fit import Settings, measure

    ladder = tuple(sorted({int(x) for x in args.profile_prompt_tokens.split(",") if x.strip()}))
    settings = Settings(url=target.url, model=target.model or "", prompt_tokens=ladder,
                        repeats=args.profile_repeats, max_batch=args.profile_max_batch,
                        output_tokens=args.profile_output_tokens, time_limit_s=args.profile_time_limit_s,
                        kv_capacity_tokens=target.kv_capacity_tokens if target.kind == "embedded" else None,
                        label=f"simulator_vs_loadgen {target.kind}", seed=args.seed)
    log(f"profiling {target.url} (prompts {ladder}, batches {settings.batches()}, <= {settings.time_limit_s:g} s)")
    profile = asyncio.run(measure(settings))
    write_profile(out / name, profile)
    log(f"profile: {out / name} in {profile.elapsed_s:.0f} s")
    return profile


def fake_dataset(path: Path, count: int, max_tokens: int, seed: int) -> Path:
    """Prompts that tell the fake engine how many tokens to send: lognormal lengths (median a third of
    max_tokens, a long tail cut at max_tokens), as reasoning answers spread."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(math.log(max_tokens / 3), 0.7, size=count)), 2, max_tokens)
    with path.open("w") as f:
        for i, k in enumerate(lengths.astype(int)):
            f.write(json.dumps({"id": f"fake:{i}", "prompt": f"Question {i}: count to {k}. [fake tokens={k}]"}) + "\n")
    return path


def run_loadgen(args: argparse.Namespace, target: Target, dataset: str, run_dir: Path, *, n: int,
                seed: int) -> list[RequestRecord]:
    command = [sys.executable, "-m", "cascade.cli", "loadgen", "--url", target.url, "--dataset", dataset,
               "--rate", str(args.rate), "--n", str(n), "--max-tokens", str(args.max_tokens),
               "--seed", str(seed), "--timeout-s", str(args.request_timeout_s), "--out", str(run_dir), "--json"]
    if target.model:
        command += ["--model", target.model]
    log(f"loadgen: {n} requests at {args.rate:g} rps ({dataset}, seed {seed}) -> {run_dir}")
    # Bounded: the schedule, then each request's own timeout, plus time to write the report.
    bound = n / args.rate + args.request_timeout_s + 120
    result = subprocess.run(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=bound, check=False)
    if result.returncode != 0:
        raise CascadeError(f"cascade loadgen exited with {result.returncode} (its error is above)")
    return read_loadgen_records(run_dir)


def stats(values: np.ndarray) -> dict[str, float]:
    return {"p50": round(float(np.percentile(values, 50)), 4), "p95": round(float(np.percentile(values, 95)), 4),
            "mean": round(float(np.mean(values)), 4)}


def rel_error(predicted: float, measured: float) -> float | None:
    return round((predicted - measured) / measured, 4) if math.isfinite(predicted) and measured > 0 else None


@dataclass(frozen=True)
class Replica:
    """The profiled replica as the simulator runs it: step costs and admission limits."""

    cost: ProfileCost
    kv_capacity_tokens: int
    max_batch: int
    max_prefill_tokens: int

    def simulate(self, arrivals: np.ndarray, inputs: np.ndarray, outputs: np.ndarray) -> SimResult:
        return simulate(self.cost, arrivals, inputs, outputs, kv_capacity_tokens=self.kv_capacity_tokens,
                        max_batch=self.max_batch, max_prefill_tokens=self.max_prefill_tokens)

    def planner_p95(self, rate: float, inputs: np.ndarray, outputs: np.ndarray, seed: int) -> tuple[float, float]:
        """(p95, saturation rps) as `cascade optimize plan` computes them for a tier (its SimSettings)."""
        sim = SimSettings()
        p, o, gaps = workload_sample(np.random.default_rng(seed), inputs, outputs, sim.requests)
        limits = {"kv_capacity_tokens": self.kv_capacity_tokens, "max_batch": self.max_batch,
                  "max_prefill_tokens": self.max_prefill_tokens}
        return (replica_percentile(self.cost, rate, p, o, gaps, percentile=sim.percentile, seed=seed, **limits),
                saturation_rps(self.cost, p, o, **limits))

    def short_runs_p95(self, rate: float, inputs: np.ndarray, outputs: np.ndarray, seed: int,
                       runs: int = 20) -> np.ndarray:
        """p95 of `runs` simulated runs shaped like the measured one (as many requests, from an idle
        engine, Poisson arrivals normalized as loadgen does): how far a run this short strays from
        the steady state the planner predicts."""
        n, values = len(inputs), []
        for r in range(runs):
            p, o, gaps = workload_sample(np.random.default_rng([seed, r]), inputs, outputs, n)
            arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
            arrivals *= ((n - 1) / rate) / arrivals[-1]
            values.append(float(np.percentile(self.simulate(arrivals, p, o).latency_s, 95)))
        return np.asarray(values)

    def own_arrivals_p95(self, arrivals: np.ndarray, inputs: np.ndarray, outputs: np.ndarray, seed: int,
                         runs: int = 20) -> np.ndarray:
        """p95 of `runs` replays with the measured run's own arrival times and its lengths shuffled among
        them. Against `short_runs_p95` (fresh arrivals) this separates the luck of the run's arrivals
        (a run with few bursts measures a low p95) from that of its lengths."""
        rng = np.random.default_rng([seed, 1])
        values = []
        for _ in range(runs):
            order = rng.permutation(len(inputs))
            values.append(float(np.percentile(self.simulate(arrivals, inputs[order], outputs[order]).latency_s, 95)))
        return np.asarray(values)


def alone_itl_ms(ok: list[RequestRecord]) -> list[np.ndarray]:
    """Per request, the inter-token latencies it decoded with nothing else in flight (batch of one, no
    prefill beside it): the engine's own speed, read off the run without any model."""
    starts = np.array([r.sent_s for r in ok], dtype=float)
    ends = starts + np.array([r.e2el_ms for r in ok], dtype=float) / 1000
    alone = []
    for r in ok:
        itl = np.asarray(r.itl_ms, dtype=float)
        token_at = (r.sent_s or 0.0) + (r.ttft_ms or 0.0) / 1000 + np.cumsum(itl) / 1000
        middle = token_at - itl / 2000
        in_flight = ((starts[:, None] <= middle) & (ends[:, None] > middle)).sum(axis=0)
        alone.append(itl[in_flight == 1])
    return alone


def phases(ok: list[RequestRecord], measured_e2e: np.ndarray, replay_e2e: np.ndarray, parts: int = 3) -> list[dict]:
    """The run in `parts` consecutive slices by send order: offered rate, measured and replayed p95, and the
    engine's batch-of-one ITL. A replay error that grows while the alone-ITL grows is engine drift, not
    the batching model."""
    alone, rows = alone_itl_ms(ok), []
    for idx in np.array_split(np.arange(len(ok)), parts):
        if len(idx) < 2:
            continue
        itl = np.concatenate([alone[i] for i in idx])
        span = (ok[idx[-1]].sent_s or 0.0) - (ok[idx[0]].sent_s or 0.0)
        measured, replayed = float(np.percentile(measured_e2e[idx], 95)), float(np.percentile(replay_e2e[idx], 95))
        rows.append({"requests": len(idx), "offered_rps": round((len(idx) - 1) / span, 4) if span > 0 else None,
                     "measured_e2e_p95_s": round(measured, 4), "replay_e2e_p95_s": round(replayed, 4),
                     "replay_p95_error": rel_error(replayed, measured),
                     "alone_itl_ms_p50": round(float(np.median(itl)), 2) if len(itl) else None,
                     "alone_steps": len(itl)})
    return rows


def drift(profile: Profile, after: Profile | None, phase_rows: list[dict]) -> dict[str, Any]:
    """How much slower the engine was at the end of the run than at its start."""
    def step(p: Profile) -> float:  # a decode step of one sequence with a GSM8K-sized context
        return p.decode.fixed_s + p.decode.per_sequence_s + p.decode.per_context_token_s * 128

    def prefill(p: Profile) -> float:
        return p.prefill.fixed_s + p.prefill.per_token_s * 128

    first, last = phase_rows[0]["alone_itl_ms_p50"], phase_rows[-1]["alone_itl_ms_p50"]
    out: dict[str, Any] = {"alone_itl_last_vs_first": round(last / first, 3) if first and last else None}
    if after is not None:
        out["profile_decode_step_after_vs_before"] = round(step(after) / step(profile), 3)
        out["profile_prefill_128_after_vs_before"] = round(prefill(after) / prefill(profile), 3)
    return out


def compare(args: argparse.Namespace, target: Target, profile: Profile, dataset: str,
            records: list[RequestRecord], profile_after: Profile | None = None,
            fitted: Profile | None = None) -> dict[str, Any]:
    ok = sorted((r for r in records if r.ok and r.sent_s is not None and r.e2el_ms is not None and r.output_tokens),
                key=lambda r: r.sent_s or 0.0)
    if len(ok) < 2:
        raise CascadeError(f"only {len(ok)} of {len(records)} requests completed; see the loadgen report")
    # The profile's prompt-token unit: the server's usage counts, or estimates from the text.
    use_usage = profile.prompt_tokens_source == "usage" and all(r.prompt_tokens for r in ok)
    prompts = [] if use_usage else build_workload(LoadConfig(
        url=target.url, dataset=dataset, rate=args.rate, n=args.n, seed=args.seed, max_tokens=args.max_tokens)).prompts
    inputs = np.array([r.prompt_tokens if use_usage else estimate_tokens(prompts[r.index].prompt) for r in ok])
    outputs = np.array([r.output_tokens for r in ok])
    sent = np.array([r.sent_s for r in ok], dtype=float)
    e2e, ttft = np.array([r.e2el_ms for r in ok]) / 1000, np.array([r.ttft_ms or 0.0 for r in ok]) / 1000

    kv = args.kv_capacity_tokens or target.kv_capacity_tokens or profile.kv_capacity_tokens or UNBOUNDED_KV_TOKENS
    replica = Replica(ProfileCost(profile, kv), kv, args.max_batch or target.max_batch,
                      args.max_prefill_tokens or target.max_prefill_tokens)
    replay = replica.simulate(sent - sent[0], inputs, outputs)
    planner_p95, capacity = replica.planner_p95(args.rate, inputs, outputs, args.seed)
    band = np.percentile(replica.short_runs_p95(args.rate, inputs, outputs, args.seed), [10, 50, 90])
    own = np.percentile(replica.own_arrivals_p95(sent - sent[0], inputs, outputs, args.seed), [10, 50, 90])

    measured, predicted = stats(e2e), stats(replay.latency_s)
    errors = {"replay_p95": rel_error(predicted["p95"], measured["p95"]),
              "replay_p50": rel_error(predicted["p50"], measured["p50"]),
              "planner_p95": rel_error(planner_p95, measured["p95"])}
    after: dict[str, Any] = {}
    if profile_after is not None:
        replay_after = dataclasses.replace(replica, cost=ProfileCost(profile_after, kv)).simulate(
            sent - sent[0], inputs, outputs)
        after = {"replay_profile_after": {"e2e_s": stats(replay_after.latency_s), "stable": replay_after.stable}}
        errors["replay_p95_profile_after"] = rel_error(after["replay_profile_after"]["e2e_s"]["p95"], measured["p95"])
    if fitted is not None:
        # A profile fitted from another load test (`cascade profile --from-loadgen`): held out from this run.
        fit_replica = dataclasses.replace(replica, cost=ProfileCost(fitted, kv))
        replay_fit = fit_replica.simulate(sent - sent[0], inputs, outputs)
        planner_fit, capacity_fit = fit_replica.planner_p95(args.rate, inputs, outputs, args.seed)
        after["loadgen_profile"] = {"replay": {"e2e_s": stats(replay_fit.latency_s), "stable": replay_fit.stable},
                                    "planner": {"e2e_p95_s": round(planner_fit, 4) if math.isfinite(planner_fit)
                                                else None, "saturation_rps": round(capacity_fit, 4),
                                                "load": round(args.rate / capacity_fit, 3)}}
        errors["replay_p95_loadgen_profile"] = rel_error(after["loadgen_profile"]["replay"]["e2e_s"]["p95"],
                                                         measured["p95"])
        errors["planner_p95_loadgen_profile"] = rel_error(planner_fit, measured["p95"])
    phase_rows = phases(ok, e2e, replay.latency_s)
    return {
        "limits": {"kv_capacity_tokens": kv, "max_batch": replica.max_batch,
                   "max_prefill_tokens": replica.max_prefill_tokens},
        "workload": {"completed": len(ok), "failed": len(records) - len(ok),
                     "input_tokens_source": "usage" if use_usage else "estimate",
                     "input_tokens": stats(inputs.astype(float)), "output_tokens": stats(outputs.astype(float)),
                     "achieved_rate_rps": round((len(ok) - 1) / float(sent[-1] - sent[0]), 4) if sent[-1] > sent[0]
                     else None},
        "measured": {"e2e_s": measured, "ttft_s": stats(ttft)},
        "predicted": {
            "replay": {"e2e_s": predicted, "ttft_s": stats(replay.ttft_s), "stable": replay.stable},
            "planner": {"e2e_p95_s": round(planner_p95, 4) if math.isfinite(planner_p95) else None,
                        "requests": SimSettings().requests, "saturation_rps": round(capacity, 4),
                        "load": round(args.rate / capacity, 3)},
            # The sampling spread of a run this short: a steady-state p95 can lie well outside it.
            "short_runs_e2e_p95_s": {"p10": round(band[0], 4), "p50": round(band[1], 4), "p90": round(band[2], 4),
                                     "runs": 20},
            # The run's own arrivals, lengths shuffled: if the measurement sits inside this band but low in
            # the one above, its arrivals were calm, and the planner's steady state is not refuted by it.
            "own_arrivals_e2e_p95_s": {"p10": round(own[0], 4), "p50": round(own[1], 4), "p90": round(own[2], 4),
                                       "runs": 20},
            **after,
        },
        "phases": phase_rows,
        "engine_drift": drift(profile, profile_after, phase_rows),
        "relative_error": errors,
        "within_25pct": {k: v is not None and abs(v) <= 0.25 for k, v in errors.items() if "p95" in k},
    }


def profile_summary(profile: Profile, path: str) -> dict[str, Any]:
    return {"path": path, "prefill": msgspec.to_builtins(profile.prefill),
            "decode": msgspec.to_builtins(profile.decode), "prompt_tokens_source": profile.prompt_tokens_source,
            "kv_capacity_tokens": profile.kv_capacity_tokens,
            "prefill_points": len(profile.prefill_points), "decode_batches": [p.batch for p in profile.decode_points],
            "elapsed_s": profile.elapsed_s}


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.from_run or args.out or
               f"runs/simulator_vs_loadgen/{args.embedded or ('fake' if args.fake else 'url')}")
    out.mkdir(parents=True, exist_ok=True)
    lengths = out / "fake-lengths.jsonl"
    if args.dataset:
        dataset = args.dataset
    elif args.fake:  # --from-run re-reads the run's own file: prompts are re-tokenised when usage is missing
        dataset = str(lengths if args.from_run and lengths.exists()
                      else fake_dataset(lengths, args.n, args.max_tokens, args.seed))
    else:
        dataset = "gsm8k"
    fitted_path = Path(args.loadgen_profile) if args.loadgen_profile else out / "profile_loadgen.json"
    if args.from_run:
        target, t0 = finished_target(args), time.monotonic()
        profile = load_profile(args.profile or out / "profile.json")
        profile_after = load_profile(out / "profile_after.json") if (out / "profile_after.json").exists() else None
        fitted = load_profile(fitted_path) if args.loadgen_profile or fitted_path.exists() else None
        records = read_loadgen_records(out / "loadgen")
        t1 = t2 = t3 = time.monotonic()
    else:
        with serve_target(args, out) as target:
            t0 = time.monotonic()
            profile = get_profile(args, target, out)
            fitted = load_profile(fitted_path) if args.loadgen_profile else None
            if args.calibrate_n:
                # A separate load test (other questions, other arrivals) to fit the profile from.
                calibration = run_loadgen(args, target, dataset, out / "calibration", n=args.calibrate_n,
                                          seed=args.seed + 1)
                fitted = profile_from_records(calibration, origin=str(out / "calibration"),
                                              kv_capacity_tokens=target.kv_capacity_tokens
                                              if target.kind == "embedded" else None)
                write_profile(fitted_path, fitted)
                log(f"profile fitted from the calibration run: {fitted_path}")
            t1 = time.monotonic()
            records = run_loadgen(args, target, dataset, out / "loadgen", n=args.n, seed=args.seed)
            t2 = time.monotonic()
            profile_after = None if args.profile or not args.profile_after else get_profile(
                args, target, out, "profile_after.json")
            t3 = time.monotonic()
    log("simulating")
    result = compare(args, target, profile, dataset, records, profile_after, fitted)
    return recorded_values({  # paths (model dir, dataset and profile files, out) repo-relative
            "target": {"kind": target.kind, "url": target.url, "model": target.model, **target.info},
            "rate_rps": args.rate, "n": args.n, "max_tokens": args.max_tokens, "dataset": dataset, "seed": args.seed,
            "profile": profile_summary(profile, args.profile or str(out / "profile.json")),
            "profile_after": profile_summary(profile_after, str(out / "profile_after.json")) if profile_after else None,
            "loadgen_profile": profile_summary(fitted, str(fitted_path)) if fitted else None,
            **result,
            "wall_s": {"profile": round(t1 - t0, 1), "loadgen": round(t2 - t1, 1), "profile_after": round(t3 - t2, 1),
                       "total": round(time.monotonic() - STARTED, 1)},
            "out": str(out)})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Check the planner's continuous-batching simulator against a measured load test: profile an "
        "engine, run `cascade loadgen` on it at --rate, and compare the measured p50/p95 end-to-end latency with "
        "the simulator's replay of the same requests and with the planner's prediction at that rate "
        "(target: p95 within 25%). Prints one JSON object; progress goes to stderr.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--url", help="a running OpenAI-compatible engine, e.g. http://127.0.0.1:30000")
    which.add_argument("--embedded", choices=["smollm2", "qwen"],
                       help="start this embedded worker as `cascade serve` does (free 127.0.0.1 port, stopped at exit)")
    which.add_argument("--fake", action="store_true",
                       help="start `cascade fake-server` (it does not batch: a check of the plumbing)")
    p.add_argument("--model", help="with --url: the model to request (default: the first of GET /v1/models)")
    p.add_argument("--rate", type=float, required=True, help="offered load, requests/s (seeded Poisson arrivals)")
    p.add_argument("--n", type=int, default=60, help="requests in the load test (default 60)")
    p.add_argument("--max-tokens", type=int, default=128, help="max output tokens per request (default 128)")
    p.add_argument("--dataset", help="loadgen dataset (default gsm8k: real questions, answers of varied length; "
                   "with --fake a generated file of lognormal output lengths)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, prompts and the planner's sample")
    p.add_argument("--request-timeout-s", type=float, default=600.0, help="loadgen's per-request timeout")
    p.add_argument("--out", help="run folder: profile.json, loadgen/ (default runs/simulator_vs_loadgen/TARGET)")
    p.add_argument("--json-out", help="also write the JSON result here")
    p.add_argument("--from-run", metavar="OUT", help="re-analyse this finished run folder (profile.json, "
                   "profile_after.json, loadgen/requests.jsonl) without starting anything; give the run's target "
                   "and --rate")
    g = p.add_argument_group("profile (skipped with --profile)")
    g.add_argument("--profile", help="an existing profile JSON (`cascade profile`) instead of measuring one")
    g.add_argument("--profile-prompt-tokens", default="32,128,512",
                   help="prompt-length ladder (default 32,128,512: around GSM8K prompt lengths)")
    g.add_argument("--profile-repeats", type=int, default=3, help="requests per prompt length")
    g.add_argument("--profile-max-batch", type=int, default=8, help="largest concurrency of the decode ladder")
    g.add_argument("--profile-output-tokens", type=int, default=32, help="max_tokens of the profile's requests")
    g.add_argument("--profile-time-limit-s", type=float, default=300.0, help="bound on the profile")
    g.add_argument("--calibrate-n", type=int, default=0, metavar="N",
                   help="before the measured load test, run a calibration load test of N requests (same rate, "
                   "seed + 1), fit a profile from its timings (`cascade profile --from-loadgen`) and report its "
                   "predictions beside the probe's (OUT/profile_loadgen.json)")
    g.add_argument("--loadgen-profile", metavar="FILE",
                   help="a profile fitted from another load test, compared beside the probe's")
    g.add_argument("--no-profile-after", dest="profile_after", action="store_false",
                   help="skip the second profile after the load test (it measures engine drift over the run)")
    g = p.add_argument_group("replica limits for the simulator (--fake: all unbounded)")
    g.add_argument("--kv-capacity-tokens", type=int, help="KV cache size in tokens (default: --embedded "
                   "cb_num_blocks x 256, the worker's; --url the profile's, SGLang reports it, else unbounded)")
    g.add_argument("--max-batch", type=int, help="most requests decoding at once (default: --embedded 1024, "
                   "transformers' max_requests_per_batch; --url 256, problem.toml's tier default)")
    g.add_argument("--max-prefill-tokens", type=int, help="prompt tokens one prefill iteration may take (default: "
                   "--embedded the worker's cb_max_batch_tokens; --url 16384, problem.toml's tier default)")
    g = p.add_argument_group("--fake engine")
    g.add_argument("--fake-ttft-ms", type=float, default=30.0, help="scripted time to first token (default 30)")
    g.add_argument("--fake-itl-ms", type=float, default=10.0, help="scripted inter-token latency (default 10)")
    args = p.parse_args(argv)
    if args.n < 2 or args.max_tokens < 2 or not args.rate > 0:
        p.error("--n and --max-tokens must be at least 2 and --rate > 0")
    if args.calibrate_n and (args.calibrate_n < 3 or args.from_run or args.loadgen_profile):
        p.error("--calibrate-n needs at least 3 requests and a live target (not --from-run or --loadgen-profile)")
    try:
        ladder = {int(x) for x in args.profile_prompt_tokens.split(",") if x.strip()}
    except ValueError:
        ladder = set()
    if len(ladder) < 2 or min(ladder) < 1:
        p.error("--profile-prompt-tokens: give at least two distinct positive lengths, e.g. 32,128,512")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C so that the `finally` blocks stop the engine and loadgen.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run(args)
    except (CascadeError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
        print(f"simulator_vs_loadgen: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
