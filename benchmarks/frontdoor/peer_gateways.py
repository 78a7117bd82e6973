"""The front door beside its peers: the same fake engine served directly, through `cascade serve` and through the
Rust gateways SGLang's model gateway (`smg`) and `vllm-router`, measured in one run.

Method
  * One `cascade fake-server` (fixed `--ttft-ms`, `--itl-ms` per token, `--tokens`, no batch limit) behind every
    target: direct; `cascade serve` (one tier, heuristic routing, model `cascade`, no keys, generous limits);
    `smg launch --worker-urls ENGINE --policy round_robin`; `vllm-router --worker-urls ENGINE --policy
    round_robin`. The peers' wheels go into throwaway venvs under `--peer-cache` (created on first use, reused
    after; never project dependencies); a peer whose wheel does not install or whose process does not answer is
    reported as skipped, with why. Every process runs in its own process group on a free 127.0.0.1 port and is
    killed at the end; a target is ready when a streamed request through it returns every token.
  * The load client is benchmarks/frontdoor/sse_load.py, a separate process per measurement (uvloop + httptools over
    keep-alive HTTP/1.1), so its CPU is its own and not this script's.
  * Closed loop at each of `--concurrency` (1, 16, 64, 256 streams): `--rounds` rounds, the targets' order
    reversed every other round so that drift on the shared cores hits all alike. Added TTFT = a target's TTFT
    percentile minus direct's at the same concurrency.
  * Sustained rate: Poisson arrivals (the same seeded arrivals for every target) on a geometric ladder of rates,
    direct first at each rate; TTFT runs from each request's scheduled time. A gateway sustains a rate when every
    request in the window answers in full and its TTFT p99 is less than `--added-p99-ms` above direct's at that
    rate; direct (client + engine alone: its ceiling is the harness's) while its p99 stays within that bound of
    its own at the first rate. A failed step is retried once (a shared machine has bursts); a second failure ends
    that target's ladder, and direct's ends every ladder (a gateway's rate is then `capped_by_direct`).
  * CPU: utime + stime of the gateway's process and its children from /proc/PID/stat, around each measurement,
    per request the client started (warm-up included); the headline sums every closed-loop cell. The engine's and
    the client's CPU and everything else the machine ran meanwhile ("others", from /proc/stat: other users, this
    script, the client's start-up) come as cores per cell: the checks say whether the client, the engine or the
    whole machine was the bottleneck (direct's ceiling must be `--headroom` times every gateway's).

Output: one JSON object on stdout (and `--out`): config, targets (per target: closed-loop cells per concurrency,
ladder steps, sustained rate, CPU s per 1,000 requests, or `skipped`), added_ttft_ms, sustained_rps,
cpu_s_per_1000_requests, checks and goal (cascade's added TTFT p50 within 0.5 ms of smg's at every concurrency and
its CPU per request within 2x of smg's).
Usage: .venv/bin/python -m benchmarks.frontdoor.peer_gateways [--quick] [--peers smg,vllm-router] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cascade.engines.supervisor import free_port
from cascade.repo_paths import recorded_value
from cascade.testing.processes import CASCADE, process
from cascade.testing.scripts import print_result

LOAD = [sys.executable, "-m", "benchmarks.frontdoor.sse_load"]  # the load client, its own process per measurement
TOKEN = re.compile(r"t\d+ ")  # the fake engine's tokens, as the load client counts them
PATH = "/v1/chat/completions"


def smg_argv(exe: Path | str, port: int, workers: Sequence[str], metrics: int, policy: str = "round_robin"
             ) -> list[str]:
    """`smg launch` on 127.0.0.1:`port` over `workers` (engine URLs) with `policy` (round_robin, cache_aware, ...),
    its Prometheus listener on 127.0.0.1:`metrics`; every other option smg's default."""
    return [str(exe), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
            "--policy", policy, "--log-level", "warn", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics)]


# The peers: wheel, version, entry point and how it is started in front of one engine.
PEERS: dict[str, dict[str, Any]] = {
    "smg": {"package": "smg", "version": "1.13.0",
            "argv": lambda exe, port, engine, metrics: smg_argv(exe, port, [engine], metrics)},
    "vllm-router": {"package": "vllm-router", "version": "0.1.17", "argv": lambda exe, port, engine, metrics: [
        str(exe), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine,
        "--policy", "round_robin", "--log-level", "warning", "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(metrics)]},
}
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
# Where the peers' venvs live unless --peer-cache says otherwise (the goodput benchmark's smg too)
PEER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cascade-bench"


def cpu_s(pid: int) -> float:
    """utime + stime of `pid` and its descendants (every thread: a Rust gateway's runtime threads count)."""
    total = 0.0
    for each in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK_S  # fields 14 and 15 of stat(5)
    return total


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has been busy since boot (/proc/stat: all but idle and iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) * TICK_S


def descendants(pid: int) -> list[int]:
    try:
        kids = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [d for k in kids for d in (k, *descendants(k))]


def peer_exe(name: str, cache: Path, log: Path) -> Path | str:
    """The peer's entry point in its venv under `cache`, installed there if missing; else why not (a string)."""
    peer = PEERS[name]
    venv = cache / f"{name}-venv"
    exe, python = venv / "bin" / name, venv / "bin" / "python"
    check = f"import importlib.metadata as m; print(m.version({peer['package']!r}))"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if exe.exists() and subprocess.run([str(python), "-c", check], capture_output=True, text=True,
                                           timeout=30).stdout.strip() == peer["version"]:
            return exe
    print(f"installing {peer['package']}=={peer['version']} into {venv} ...", file=sys.stderr)
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--retries", "1",
              "--timeout", "20", f"{peer['package']}=={peer['version']}"]]
    with log.open("ab") as out:
        for argv in steps:
            try:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"{' '.join(argv[:4])}: {exc}"
            if done.returncode != 0:
                return f"{' '.join(argv[:4])} exited {done.returncode}: {tail(log)}"
    return exe if exe.exists() else f"no {exe} after install"


def tail(log: Path, chars: int = 600) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return " | ".join(line for line in text[-chars:].splitlines() if line.strip())


def body(model: str, tokens: int) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}], "stream": True,
                       "max_tokens": tokens})


def ready(port: int, model: str, tokens: int, proc: subprocess.Popen[bytes], within_s: float) -> str | None:
    """None once a streamed request through `port` returns all its tokens; else why not."""
    deadline, why = time.monotonic() + within_s, "no answer"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        request = urllib.request.Request(f"http://127.0.0.1:{port}{PATH}", body(model, tokens).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with opener.open(request, timeout=10) as response:
                text = response.read().decode()
            if len(TOKEN.findall(text)) == tokens and "[DONE]" in text:
                return None
            why = f"incomplete stream: {text[-300:]!r}"
        except OSError as exc:
            why = str(exc)
        time.sleep(0.3)
    return why


class Target:
    def __init__(self, name: str, port: int, model: str, pid: int, tokens: int) -> None:
        self.name, self.port, self.pid, self.body = name, port, pid, body(model, tokens)
        self.closed: dict[int, list[dict[str, Any]]] = {}
        self.steps: list[dict[str, Any]] = []
        self.ladder_runs: list[dict[str, Any]] = []
        self.sustained: float | None = None
        self.alive = True
        self.capped = False  # its ladder ended because direct's did


def measure(args: argparse.Namespace, target: Target, engine_pid: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One client run against `target`, with the CPU the gateway (direct: none) and the engine spent meanwhile."""
    spec = {"port": target.port, "path": PATH, "body": target.body, "tokens": args.tokens, "seed": args.seed,
            "stream_s": (args.ttft_ms + args.itl_ms * (args.tokens - 1)) / 1e3, "drain_s": 10.0, **spec}
    gateway0, engine0, machine0 = cpu_s(target.pid), cpu_s(engine_pid), machine_busy_s()
    done = subprocess.run([*LOAD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=spec["warmup_s"] + spec["window_s"] + 60)
    if done.returncode != 0:
        raise RuntimeError(f"load client failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    wall = result["wall_s"]
    result["client_cpu_s"] = result["cpu_s"]
    result["gateway_cpu_s"] = 0.0 if target.name == "direct" else cpu_s(target.pid) - gateway0
    result["engine_cpu_s"] = cpu_s(engine_pid) - engine0
    ours = result["gateway_cpu_s"] + result["engine_cpu_s"] + result["client_cpu_s"]
    result["others_cpu_s"] = max(0.0, machine_busy_s() - machine0 - ours)  # other people's work on the cores
    result["cores"] = {k: round(result[f"{k}_cpu_s"] / wall, 3) for k in ("gateway", "engine", "client", "others")}
    return result


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def closed_phase(args: argparse.Namespace, targets: list[Target], engine_pid: int) -> None:
    for concurrency in args.concurrency:
        window = args.window_s * (3 if concurrency == 1 else 1)  # one stream at a time yields few samples
        print(f"closed loop c={concurrency}: {args.rounds} rounds x {window:g} s per target", file=sys.stderr)
        for r in range(args.rounds):
            for target in targets if r % 2 == 0 else targets[::-1]:
                spec = {"mode": "closed", "concurrency": concurrency, "warmup_s": args.warmup_s, "window_s": window}
                target.closed.setdefault(concurrency, []).append(measure(args, target, engine_pid, spec))


def cell_summary(runs: list[dict[str, Any]], direct: list[dict[str, Any]] | None) -> dict[str, Any]:
    ttft = [v for run in runs for v in run["ttft_ms"]]
    started = sum(run["started"] for run in runs)
    out: dict[str, Any] = {
        "requests": len(ttft), "errors": sum(run["errors"] for run in runs),
        "requests_per_s": round(len(ttft) / sum(run["wall_s"] for run in runs), 1),
        "ttft_ms": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "gateway_cpu_s_per_1000": round(1000 * sum(run["gateway_cpu_s"] for run in runs) / max(started, 1), 3),
        "engine_cpu_s_per_1000": round(1000 * sum(run["engine_cpu_s"] for run in runs) / max(started, 1), 3),
        "cores_max": {k: max(run["cores"][k] for run in runs) for k in ("gateway", "engine", "client", "others")},
        "machine_cores_max": round(max(sum(run["cores"].values()) for run in runs), 3)}
    if direct is not None:
        base = [v for run in direct for v in run["ttft_ms"]]
        out["added_ttft_ms"] = {q: minus(pct(ttft, n), pct(base, n)) for q, n in (("p50", 50), ("p99", 99))}
    return out


def ladder_phase(args: argparse.Namespace, targets: list[Target], engine_pid: int) -> float | None:
    """Up the same ladder of Poisson rates, direct first at each rate: direct passes while its TTFT p99 stays
    within the bound of its own p99 at the first rate (its base, returned), a gateway while its p99 stays within
    the bound of direct's at the same rate. Two failures at one rate end a target's ladder; direct's ends all."""
    rates = [args.rate_start * args.rate_step ** i for i in range(64)
             if args.rate_start * args.rate_step ** i <= args.rate_max]
    direct, gateways = targets[0], targets[1:]
    base: float | None = None
    for i, rate in enumerate(rates):
        alive = [t for t in gateways if t.alive]
        print(f"rate {rate:.0f}/s: direct, {', '.join(t.name for t in alive)}", file=sys.stderr)
        window = args.rate_window_s * (2 if i == 0 else 1)  # the first step also sets direct's base
        reference = step(args, direct, engine_pid, rate, window, None if i == 0 else base)
        if i == 0:
            base = reference
        if not direct.alive or reference is None:
            for target in alive:
                target.capped = True  # the client + engine side stopped here, not the gateway
            break
        for target in alive if i % 2 == 0 else alive[::-1]:
            step(args, target, engine_pid, rate, window, reference)
    return base


def step(args: argparse.Namespace, target: Target, engine_pid: int, rate: float, window: float,
         reference: float | None) -> float | None:
    """One rate for one target, retried once on failure; returns its passing p99 (None if it failed twice).
    `reference` None: the first step, which passes if it answers every request."""
    for attempt in (1, 2):
        spec = {"mode": "open", "rate": rate, "warmup_s": args.warmup_s, "window_s": window}
        run = measure(args, target, engine_pid, spec)
        target.ladder_runs.append(run)
        p99 = pct(run["ttft_ms"], 99)
        added = minus(p99, reference)
        ok = run["errors"] == 0 and p99 is not None and (added is None or added < args.added_p99_ms)
        target.steps.append({"rate": round(rate, 1), "attempt": attempt, "requests": run["ok"],
                             "errors": run["errors"], "ttft_p50_ms": pct(run["ttft_ms"], 50), "ttft_p99_ms": p99,
                             "added_p99_ms": added, "lag_p99_ms": run["lag_ms"]["p99"], "cores": run["cores"],
                             "ok": ok})
        if ok:
            target.sustained = round(rate, 1)
            return p99
    target.alive = False
    return None


def report(args: argparse.Namespace, targets: list[Target], skipped: dict[str, str], base: float | None,
           config: dict[str, Any]) -> dict[str, Any]:
    direct = targets[0]
    out: dict[str, Any] = {"config": config, "targets": {}, "added_ttft_ms": {}, "sustained_rps": {},
                           "cpu_s_per_1000_requests": {}}
    for target in targets:
        cells = {f"c{c}": cell_summary(runs, None if target is direct else direct.closed[c])
                 for c, runs in target.closed.items()}
        started = sum(run["started"] for runs in target.closed.values() for run in runs)
        cpu = sum(run["gateway_cpu_s"] for runs in target.closed.values() for run in runs)
        out["targets"][target.name] = {"closed": cells, "ladder": target.steps, "sustained_rps": target.sustained,
                                       "reached_ladder_top": bool(target.alive and target.steps),
                                       "capped_by_direct": target.capped}
        out["sustained_rps"][target.name] = target.sustained
        if target is not direct:
            out["added_ttft_ms"][target.name] = {c: cell["added_ttft_ms"] for c, cell in cells.items()}
            out["cpu_s_per_1000_requests"][target.name] = round(1000 * cpu / max(started, 1), 3)
    for name, why in skipped.items():
        out["targets"][name] = {"skipped": why}
    out["checks"] = checks(args, targets, base)
    out["goal"] = goal(out, targets)
    return out


def checks(args: argparse.Namespace, targets: list[Target], base: float | None) -> dict[str, Any]:
    """Was the client, the engine or the machine the bottleneck? Direct's ceiling must be well above every
    gateway's, and no process of the client + engine side may fill a core."""
    direct, gateways = targets[0], targets[1:]
    best = max((t.sustained or 0.0 for t in gateways), default=0.0)
    ratio = None if not best or direct.sustained is None else round(direct.sustained / best, 2)
    # Direct's steps above every gateway's last rate find the harness's own ceiling: they are meant to fill it.
    top = max((step["rate"] for t in gateways for step in t.steps), default=float("inf"))
    runs = [run for t in targets for each in t.closed.values() for run in each]
    runs += [run for t in targets for step, run in zip(t.steps, t.ladder_runs, strict=True) if step["rate"] <= top]
    busiest = {k: max((run["cores"][k] for run in runs), default=0.0) for k in ("client", "engine", "others")}
    others = [run["cores"]["others"] for run in runs]
    p50 = {c: pct([v for run in each for v in run["ttft_ms"]], 50) for c, each in direct.closed.items()}
    first = p50[min(p50)] if p50 else None
    full = 0.95 * (os.cpu_count() or 1)  # every core busy, ours and others' together: queueing is the machine's
    saturated = [f"{t.name}:c{c}" for t in targets for c, each in t.closed.items()
                 if max(sum(run["cores"].values()) for run in each) > full]
    inflation = {f"c{c}": minus(v, first) for c, v in p50.items()}
    if busiest["client"] > 0.9 or (ratio is not None and ratio < args.headroom and not direct.alive):
        client_bound: bool | None = True
    elif ratio is None or ratio < args.headroom:
        client_bound = None  # direct reached the ladder's top, or no gateway passed a step: cannot tell
    else:
        client_bound = False
    return {"base_p99_ms": base, "direct_ceiling_rps": direct.sustained,
            "direct_reached_ladder_top": bool(direct.alive and direct.steps), "direct_over_best_gateway": ratio,
            "client_bottleneck": client_bound, "engine_bottleneck": busiest["engine"] > 0.9,
            "client_max_cores": busiest["client"], "engine_max_cores": busiest["engine"],
            # everything else on the machine while a measurement ran: other users, this script, client start-up
            "others_cores_mean": round(float(np.mean(others)), 3) if others else None,
            "others_cores_max": busiest["others"],
            "direct_ttft_p50_inflation_ms": inflation,
            "direct_saturated_at": [c for c, v in inflation.items() if v is not None and v > 5.0],
            "machine_saturated_cells": saturated,
            "loadavg_1m": {"start": args.loadavg_start, "end": round(os.getloadavg()[0], 2)}}


def goal(out: dict[str, Any], targets: list[Target]) -> dict[str, Any]:
    """cascade's added TTFT p50 within 0.5 ms of smg's at every concurrency, its CPU within 2x of smg's."""
    added, cpu = out["added_ttft_ms"], out["cpu_s_per_1000_requests"]
    if "cascade" not in added or "smg" not in added:
        return {"peer": "smg", "met": None, "why": "smg did not run"}
    gaps = {c: minus(v["p50"], added["smg"][c]["p50"]) for c, v in added["cascade"].items()}
    by_name = {t.name: t for t in targets}
    by_round = {f"c{c}": [minus(pct(a["ttft_ms"], 50), pct(b["ttft_ms"], 50))
                          for a, b in zip(runs, by_name["smg"].closed[c], strict=True)]
                for c, runs in by_name["cascade"].closed.items()}
    p50_met = all(g is not None and g <= 0.5 for g in gaps.values())
    ratio = round(cpu["cascade"] / cpu["smg"], 2) if cpu["smg"] else None
    cpu_met = ratio is not None and ratio <= 2.0
    every_peer = {name: round(cpu["cascade"] / v, 2) for name, v in cpu.items() if name != "cascade" and v}
    return {"peer": "smg", "added_p50_gap_ms": gaps, "p50_gap_ms_by_round": by_round,
            "p50_within_0_5_ms": p50_met, "cpu_ratio": ratio, "cpu_ratio_by_peer": every_peer,
            "cpu_within_2x": cpu_met, "met": p50_met and cpu_met}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peers", default="smg,vllm-router", help="comma-separated, from: " + ", ".join(PEERS))
    p.add_argument("--peer-cache", type=Path, default=PEER_CACHE, help="where the peers' venvs live (reused)")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    p.add_argument("--rounds", type=int, default=4, help="closed-loop rounds per concurrency (order flips)")
    p.add_argument("--window-s", type=float, default=1.5, help="measured s per target per round (c=1: 3x)")
    p.add_argument("--warmup-s", type=float, default=0.5, help="unmeasured s before every window")
    p.add_argument("--rate-start", type=float, default=50.0)
    p.add_argument("--rate-step", type=float, default=1.5)
    p.add_argument("--rate-max", type=float, default=3000.0)
    p.add_argument("--rate-window-s", type=float, default=2.0, help="measured s per ladder step (first: twice)")
    p.add_argument("--added-p99-ms", type=float, default=10.0, help="a sustained rate's bound on added TTFT p99")
    p.add_argument("--headroom", type=float, default=1.5, help="direct's ceiling / best gateway's, at least")
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="a smoke run: c=1,4, one round, a two-step ladder")
    p.add_argument("--out", "--json-out", dest="out", type=Path, help="also write the JSON here")
    args = p.parse_args()
    args.loadavg_start = round(os.getloadavg()[0], 2)
    if args.quick:
        args.concurrency, args.rounds, args.window_s, args.warmup_s = [1, 4], 1, 1.0, 0.3
        args.rate_start, args.rate_max, args.rate_window_s = 20.0, 30.0, 1.0
    return args


def main() -> int:
    args = parse_args()
    peers = [name for name in args.peers.split(",") if name]
    unknown = [name for name in peers if name not in PEERS]
    if unknown:
        print(f"peer_gateways: unknown peers {unknown}; known: {list(PEERS)}", file=sys.stderr)
        return 2
    engine_port, cascade_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="cascade-peers-") as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        engine = stack.enter_context(process(
            [*CASCADE, "fake-server", "--host", "127.0.0.1", "--port", str(engine_port), "--ttft-ms",
             str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--tokens", str(args.tokens)], logs / "engine.log"))
        config = logs / "cascade.toml"
        config.write_text("[gateway.limits]\nmax_in_flight = 8192\nmax_in_flight_per_tier = 8000\n"
                          "max_backend_streams = 8192\n\n[routing]\npolicy = \"heuristic\"\n\n"
                          f'[[tiers]]\nname = "bench"\nbackends = [{{kind = "openai", url = "{engine_url}", '
                          'model = "fake-model"}]\n')
        gateway = stack.enter_context(process(
            [*CASCADE, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(cascade_port),
             "--log-level", "warning"], logs / "cascade.log"))
        targets = [Target("direct", engine_port, "fake-model", engine.pid, args.tokens),
                   Target("cascade", cascade_port, "cascade", gateway.pid, args.tokens)]
        for target, proc, name in ((targets[0], engine, "engine.log"), (targets[1], gateway, "cascade.log")):
            if (why := ready(target.port, "fake-model" if target.name == "direct" else "cascade", args.tokens,
                             proc, 60)) is not None:
                raise RuntimeError(f"{target.name} did not start: {why}: {tail(logs / name)}")
        versions: dict[str, str] = {}
        for name in peers:
            exe = peer_exe(name, args.peer_cache, logs / f"{name}-install.log")
            if isinstance(exe, str):
                skipped[name] = f"install failed: {exe}"
                continue
            port, log = free_port(), logs / f"{name}.log"
            proc = stack.enter_context(process(PEERS[name]["argv"](exe, port, engine_url, free_port()), log))
            if (why := ready(port, "fake-model", args.tokens, proc, 60)) is not None:
                skipped[name] = f"did not serve: {why}: {tail(log)}"
                continue
            targets.append(Target(name, port, "fake-model", proc.pid, args.tokens))
            versions[name] = PEERS[name]["version"]
        config_out = {**{k: recorded_value(v) for k, v in vars(args).items()},  # paths repo-relative
                      "cpus": os.cpu_count(), "cpu_model": cpu_model(), "python": platform.python_version(),
                      "peer_versions": versions, "client": "benchmarks/frontdoor/sse_load.py (uvloop + httptools)"}
        started = time.monotonic()
        closed_phase(args, targets, engine.pid)
        base = ladder_phase(args, targets, engine.pid)
        config_out["measured_s"] = round(time.monotonic() - started, 1)
        result = report(args, targets, skipped, base, config_out)
    print_result(result, args.out, indent=2)
    return 0


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
