"""One measured point of the goodput benchmark: an arm at one offered rate and one arrival seed.

The arm's emulated GPUs are one `cascade.testing.twin_fleet` process; its front is `cascade serve` (one per fold:
each fold's questions go to the gateway holding the other fold's router) or `smg`; each fold's questions come from
its own `cascade loadgen` at half the rate (two independent Poisson streams make one; two Gamma streams are a
little smoother than one of the same CV, stated in the results). Everything runs on a wall clock `time_scale` times
slower than the emulated GPUs, so rates are divided and latencies multiplied by it on the way in, and divided on the
way out: every number this module returns is in emulated seconds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.planner.goodput import smg
from benchmarks.planner.goodput.arms import PLAIN_TIER, Arm, gateway_toml
from benchmarks.planner.goodput.folds import Fold
from benchmarks.planner.goodput.scores import ENGINE_COUNTS
from cascade.engines.supervisor import free_port
from cascade.testing.processes import CASCADE, process, stop
from cascade.testing.twin import H200, V8_TWIN
from cascade.testing.twin_fleet import EngineSpec, FleetSpec
from cascade.testing.waiting import wait_http


@dataclass(frozen=True)
class Setting:
    """What every point of a run shares: wall seconds per emulated second, the engines' batch cap and stream
    interval, the SLOs (emulated seconds), requests per fold, the arrival process."""

    time_scale: float
    max_running: int
    stream_interval: int
    ttft_slo_s: float
    e2e_slo_s: float
    requests_per_fold: int
    arrival: str  # "poisson" | "gamma"
    burstiness: float = 1.0  # gamma shape (CV = 1/sqrt(shape)): 0.25 is CV 2


@contextlib.contextmanager
def fleet(arm: Arm, setting: Setting, work: Path) -> Iterator[dict[str, list[str]]]:
    """The arm's emulated GPUs; yields tier -> engine URLs."""
    twins = {t.tier: t for t in V8_TWIN}
    order = [tier for tier, count in arm.replicas.items() for _ in range(count)]
    spec = FleetSpec(time_scale=setting.time_scale, max_running=setting.max_running,
                     stream_interval=setting.stream_interval,
                     engines=[EngineSpec(profile=str(H200 / f"{twins[t].profile}.json"), tier=t,
                                         records=[str(p) for p in twins[t].records]) for t in order])
    spec_file, log = work / "fleet.json", work / "fleet.log"
    spec_file.write_bytes(msgspec.json.encode(spec))
    with log.open("wb") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "cascade.testing.twin_fleet", str(spec_file)],
                                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fleet did not start: {log.read_text()[-2000:]}")
        urls = json.loads(line)["urls"]
        by_tier: dict[str, list[str]] = {}
        for tier, url in zip(order, urls, strict=True):
            by_tier.setdefault(tier, []).append(url)
        yield by_tier
    finally:
        stop(proc, grace_s=0)  # type: ignore[arg-type]
        if proc.stdout is not None:
            proc.stdout.close()


LOADGEN_OVERHEAD_S = 120.0

def engine_report(urls: dict[str, list[str]]) -> dict[str, Any]:
    """`lag_s`: the largest emulated time any engine lost to a late event loop (0: the CPU kept the GPUs' pace);
    ENGINE_COUNTS summed over the engines; `requests_by_engine`: per tier, the requests each of its engines got (how
    evenly the replica picker spread them)."""
    report: dict[str, Any] = dict.fromkeys(("lag_s", *ENGINE_COUNTS), 0.0)
    spread: dict[str, list[int]] = {}
    for tier, url in ((t, u) for t, us in urls.items() for u in us):
        gpu, stats = _read_json(f"{url}/fake/gpu"), _read_json(f"{url}/fake/stats")
        report["lag_s"] = max(report["lag_s"], float(gpu.get("lag_s", 0.0)))
        report["gpu_busy_s"] += float(gpu.get("gpu_s", 0.0))
        report["aborts_received"] += len(stats.get("abort_requests", []))
        report["stopped_on_disconnect"] += stats.get("streams_cancelled", 0) + stats.get("requests_cancelled", 0)
        report["tokens_sent"] += stats.get("tokens_sent", 0)
        spread.setdefault(tier, []).append(int(stats.get("requests", 0)))
    return {**{k: round(v, 4) for k, v in report.items()}, "requests_by_engine": spread}


def _read_json(url: str) -> dict[str, Any]:
    """GET `url` as a JSON object ({} when it does not answer one: the report says what it could read)."""
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
        return body if isinstance(body, dict) else {}
    return {}


@contextlib.contextmanager
def front(arm: Arm, urls: dict[str, list[str]], folds: list[Fold], setting: Setting, work: Path
          ) -> Iterator[dict[str, str]]:
    """The arm's gateway(s); yields fold name -> base URL. Every process it starts is stopped on the way out."""
    with contextlib.ExitStack() as stack:
        if arm.front == "smg":
            url = stack.enter_context(smg.gateway(urls[PLAIN_TIER], "round_robin", work))
            yield {f.name: url for f in folds}
            return
        if arm.tier_smg:  # each tier's replicas behind their own smg: the tier's one backend
            urls = {tier: [stack.enter_context(smg.gateway(engines, arm.tier_smg, work, f"smg-{tier}"))]
                    for tier, engines in urls.items()}
        served = {}
        for fold in folds:
            port = free_port()
            config, log = work / f"gateway-{fold.name}.toml", work / f"gateway-{fold.name}.log"
            config.write_text(gateway_toml(arm, urls, fold.name, max_running=setting.max_running,
                                           slo_e2e_ms=setting.e2e_slo_s * 1000 * setting.time_scale))
            argv = [*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
            if fold.name in arm.plan:
                argv += ["--plan", str(arm.plan[fold.name])]
            proc = stack.enter_context(process(argv, log, cwd=work, grace_s=2))
            served[fold.name] = f"http://127.0.0.1:{port}"
            wait_http(f"{served[fold.name]}/health", proc, log, 120)
        yield served


def measure(arm: Arm, folds: list[Fold], rate: float, seed: int, setting: Setting, work: Path,
            quality: dict[str, str]) -> dict[str, Any]:
    """Run the arm at `rate` emulated requests/s (both folds together) with arrival seed `seed`; returns the point:
    one compact row per request (emulated seconds), the fleet's lag and what its engines saw (`engine_report`)."""
    work.mkdir(parents=True, exist_ok=True)
    s = setting.time_scale
    started = time.perf_counter()
    slo = 2 * setting.e2e_slo_s * s  # each request's timeout and the drain after the last arrival (wall s)
    # Past this, a loadgen is stuck: its arrivals (a Gamma draw may run longer: twice Poisson's mean), then one
    # request's timeout and the drain, and its start and grading
    within_s = 2 * setting.requests_per_fold / (rate / len(folds) / s) + 2 * slo + LOADGEN_OVERHEAD_S
    with (fleet(arm, setting, work) as urls, front(arm, urls, folds, setting, work) as gateways,
          contextlib.ExitStack() as running):
        loadgens = []
        for i, fold in enumerate(folds):
            out = work / f"loadgen-{fold.name}"
            argv = [*CASCADE, "loadgen", "--url", gateways[fold.name], "--dataset", str(fold.dataset),
                    "--rate", f"{rate / len(folds) / s:.6f}", "--n", str(setting.requests_per_fold),
                    "--arrival", setting.arrival, "--seed", str(seed * len(folds) + i),
                    "--slo", f"ttft_ms={setting.ttft_slo_s * 1000 * s:.1f},e2el_ms={setting.e2e_slo_s * 1000 * s:.1f}",
                    "--max-tokens", str(512), "--model", arm.model, "--timeout-s", f"{slo:.1f}",
                    "--drain-s", f"{slo:.1f}", "--no-progress", "--out", str(out)]
            if setting.arrival == "gamma":
                argv += ["--burstiness", str(setting.burstiness)]
            if arm.front == "cascade" and arm.model == "cascade":
                argv += ["--quality-mix", f"{quality[fold.name]}=1"]
            loadgens.append((fold, out, running.enter_context(process(argv, work / f"loadgen-{fold.name}.log"))))
        deadline = time.monotonic() + within_s
        for _, _, proc in loadgens:
            proc.wait(max(1.0, deadline - time.monotonic()))  # TimeoutExpired: the stack stops them all
        engines = engine_report(urls)
    rows = []
    for fold, out, proc in loadgens:
        if proc.returncode not in (0, 1):  # 1: the run finished with failed requests
            raise RuntimeError(f"loadgen for fold {fold.name} exited {proc.returncode}: "
                               f"{(work / f'loadgen-{fold.name}.log').read_text()[-2000:]}")
        for line in (out / "requests.jsonl").read_text().splitlines():
            r = json.loads(line)
            rows.append({"fold": fold.name, "q": r["prompt_id"], "tier": r.get("tier"),
                         "ttft_s": None if r.get("ttft_ms") is None else r["ttft_ms"] / 1000 / s,
                         "e2e_s": None if r.get("e2el_ms") is None else r["e2el_ms"] / 1000 / s,
                         "correct": bool(r.get("correct")), "error": r.get("error"), "status": r.get("status")})
    return {"arm": arm.name, "rate": rate, "seed": seed, "gpus": arm.gpus, "replicas": arm.replicas,
            "lag_s": engines.pop("lag_s"), "engines": engines, "wall_s": round(time.perf_counter() - started, 1),
            "requests": rows}
