"""Gateway overhead: the same streaming load against the fake engine directly (A) and through the
gateway (B), side by side in one run.

Method
  * The fake engine (`cascade fake-server`, scripted TTFT/ITL/tokens) and the gateway (`cascade serve`
    with one tier pointing at the engine) run as subprocesses on free 127.0.0.1 ports, each in its own
    process group, killed in `finally`. Every wait is bounded.
  * High-concurrency pass: a closed loop of `--concurrency` workers, each sending streaming chat
    completions back to back. The measured time (`--duration-s` per target) is split into `--rounds`
    rounds run A,B then B,A alternately, so drift and machine noise hit both targets alike. Each round
    starts with a warm-up; a request counts if it *completes* inside the round's window.
  * Low-concurrency pass: `--low-requests` requests one at a time per target, also alternated in
    rounds; this isolates the latency the gateway adds when nothing queues.
  * Per request: TTFT (first SSE event carrying non-empty `content`) and E2E (until `[DONE]`).
    A request is an error unless it returns 200, ends with `[DONE]` and carries all `--tokens` tokens.
  * CPU seconds of the client, the engine and the gateway per completed request come from
    `time.process_time` and /proc/PID/schedstat; client, gateway and engine share the same cores.

  * `--tracing`: a third target, a second gateway with OpenTelemetry tracing on (`[gateway.tracing]`, sampler ratio
    1.0, OTLP/HTTP to a local sink that decodes and counts: `python -m cascade.testing.otlp`), in the same rounds.

Output: one JSON object on stdout: config, direct, gateway, ratio (each keyed by pass, `c<N>`) and
targets (added p50 latency at concurrency 1 < 2 ms; throughput ratio at high concurrency >= 0.8); with `--tracing`
also traced, tracing (traced against the untraced gateway) and tracing_sink (spans the sink received), and the
target tracing adds < 0.2 ms p50 at concurrency 1.
Usage: .venv/bin/python -m benchmarks.frontdoor.gateway_overhead [--duration-s 20] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from cascade.engines.supervisor import free_port
from cascade.repo_paths import recorded_value
from cascade.testing.processes import CASCADE, start, stop
from cascade.testing.scripts import print_result
from cascade.testing.waiting import wait_http

# The fake engine's tokens are "t0 ", "t1 ", ...; count them, not chunks: a busy gateway merges the
# chunks that arrive together into one frame.
TOKEN = re.compile(rb"t\d+ ")


def uvicorn_impl(pid: int) -> str:
    """Which event loop and HTTP parser a running uvicorn process loaded (uvicorn's "auto" picks)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return f'{"uvloop" if "/uvloop/" in maps else "asyncio"}+{"httptools" if "/httptools/" in maps else "h11"}'


def cpu_s(pid: int) -> float:
    """CPU time the scheduler gave `pid` and its child processes (multi-process gateway), ns-exact
    unlike the tick-sampled utime/stime in /proc/PID/stat."""
    total = 0.0
    for child in [pid, *children(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int(Path(f"/proc/{child}/schedstat").read_text().split()[0]) / 1e9
    return total


def children(pid: int) -> list[int]:
    try:
        direct = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []
    return [c for d in direct for c in (d, *children(d))]


async def scan(chunks, t0: float) -> tuple[float, int, bool]:
    """Read an SSE body: (TTFT s, tokens, saw [DONE] and no error). Counts whole lines only."""
    ttft, tokens, tail, ok = float("nan"), 0, b"", False
    async for chunk in chunks:
        buf = tail + chunk
        cut = buf.rfind(b"\n") + 1
        n = len(TOKEN.findall(buf, 0, cut))
        if n and tokens == 0:
            ttft = time.perf_counter() - t0
        tokens += n
        if b'"error"' in buf:
            return ttft, tokens, False
        ok = ok or b"data: [DONE]" in buf[:cut]
        tail = buf[cut:]
    return ttft, tokens, ok


class Client:
    """aiohttp, not httpx: at concurrency 50 on this 2-core box httpx 0.28 used ~14x more client CPU per
    streamed request (its connection pool rescans every connection on each request and release)."""

    def __init__(self, connections: int, tokens: int) -> None:
        self.tokens = tokens
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                             timeout=aiohttp.ClientTimeout(total=60), auto_decompress=False)

    async def request(self, url: str, body: bytes) -> tuple[float, float, int, bool]:
        """(TTFT s, E2E s, tokens, ok)."""
        t0 = time.perf_counter()
        try:
            async with self.session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                ttft, tokens, ok = await scan(r.content.iter_any(), t0)
                ok = ok and r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return float("nan"), time.perf_counter() - t0, 0, False
        return ttft, time.perf_counter() - t0, tokens, ok and tokens == self.tokens


class Target:
    def __init__(self, url: str, model: str, pid: int, tokens: int) -> None:
        self.url, self.pid = url, pid
        self.body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                                "stream": True, "max_tokens": tokens}).encode()
        self.reset()

    def reset(self) -> None:
        self.samples: list[tuple[float, float, int, bool]] = []  # (TTFT s, E2E s, tokens, ok) in the windows
        self.finished = 0  # every request finished while CPU was being measured, warm-up and drain included
        self.window_s = self.client_cpu_s = self.server_cpu_s = 0.0


async def closed_loop(client: Client, target: Target, concurrency: int, warmup_s: float, window_s: float,
                      stagger_s: float) -> None:
    now = time.perf_counter()
    w0, w1 = now + warmup_s, now + warmup_s + window_s

    async def worker(i: int) -> None:
        await asyncio.sleep(i * stagger_s / concurrency)  # spread the starts: no artificial lock-step waves
        while time.perf_counter() < w1:
            sample = await client.request(target.url, target.body)
            target.finished += 1
            if w0 <= time.perf_counter() <= w1:
                target.samples.append(sample)

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(concurrency))), warmup_s + window_s + 90)
    target.window_s += window_s


async def one_by_one(client: Client, target: Target, n: int) -> None:
    for _ in range(n):
        sample = await client.request(target.url, target.body)
        target.samples.append(sample)
        target.finished += 1
        target.window_s += sample[1]


async def run_pass(args: argparse.Namespace, targets: list[Target], concurrency: int) -> None:
    client = Client(concurrency + 8, args.tokens)
    stagger_s = min(args.warmup_s, (args.ttft_ms + args.itl_ms * (args.tokens - 1)) / 1e3)
    window_s = args.duration_s / args.rounds
    try:
        for target in targets:  # open connections and warm both servers
            await (closed_loop(client, target, concurrency, 1.0, 0.0, stagger_s) if concurrency > 1
                   else one_by_one(client, target, 5))
            target.reset()
        for i in range(args.rounds):
            for target in targets if i % 2 == 0 else targets[::-1]:
                cpu0, server0 = time.process_time(), cpu_s(target.pid)
                await (closed_loop(client, target, concurrency, args.warmup_s, window_s, stagger_s)
                       if concurrency > 1 else one_by_one(client, target, args.low_requests // args.rounds))
                target.client_cpu_s += time.process_time() - cpu0
                target.server_cpu_s += cpu_s(target.pid) - server0
    finally:
        await client.session.close()


def summarize(t: Target) -> dict[str, object]:
    ok = [s for s in t.samples if s[3]]
    n = max(t.finished, 1)

    def pct(values: list[float]) -> dict[str, float | None]:
        a = np.array(values) * 1e3
        return {f"p{q}": round(float(np.percentile(a, q)), 3) if len(a) else None for q in (50, 99)}

    return {"completed": len(ok), "errors": len(t.samples) - len(ok), "window_s": round(t.window_s, 3),
            "requests_per_s": round(len(ok) / t.window_s, 2),
            "tokens_per_s": round(sum(s[2] for s in ok) / t.window_s, 1),
            "ttft_ms": pct([s[0] for s in ok]), "e2e_ms": pct([s[1] for s in ok]),
            "client_cpu_ms_per_request": round(t.client_cpu_s * 1e3 / n, 3),
            # direct: the engine process; gateway: the gateway process alone (not the engine behind it)
            "server_cpu_ms_per_request": round(t.server_cpu_s * 1e3 / n, 3)}


def compare(direct: dict, gateway: dict) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "throughput": round(gateway["requests_per_s"] / max(direct["requests_per_s"], 1e-9), 3)}
    for metric, q in (("ttft", "p50"), ("e2e", "p50"), ("e2e", "p99")):
        d, g = direct[f"{metric}_ms"][q], gateway[f"{metric}_ms"][q]
        out[f"{metric}_{q}_added_ms"] = None if d is None or g is None else round(g - d, 3)
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--duration-s", type=float, default=20.0, help="measured s per target at --concurrency")
    p.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured s at the start of every round")
    p.add_argument("--rounds", type=int, default=4, help="A/B rounds per pass (order flips every round)")
    p.add_argument("--low-requests", type=int, default=200, help="requests per target at concurrency 1")
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--model", default="cascade", help="`cascade` (routed) or `bench` (the tier)")
    p.add_argument("--gateway-processes", type=int, default=1, help="`cascade serve --processes`")
    p.add_argument("--tracing", action="store_true",
                   help="also a gateway with tracing on (ratio 1.0, exported to a local OTLP/HTTP sink), side by side")
    p.add_argument("--json-out", help="also write the JSON here")
    return p.parse_args()


def measure(args: argparse.Namespace, engine: Target, gateway: Target, traced: Target | None = None
            ) -> dict[str, dict]:
    uvicorn = {"engine": uvicorn_impl(engine.pid), "gateway": uvicorn_impl(gateway.pid)}
    config = {k: recorded_value(v) for k, v in vars(args).items()}  # --json-out repo-relative
    result: dict[str, dict] = {"config": {**config, "cpus": os.cpu_count(), "uvicorn": uvicorn},
                               "direct": {}, "gateway": {}, "ratio": {}}
    if traced is not None:
        result |= {"traced": {}, "tracing": {}}
    for concurrency in dict.fromkeys((args.concurrency, 1)):
        key = f"c{concurrency}"
        print(f"pass {key}: {args.rounds} A/B rounds ...", file=sys.stderr)
        asyncio.run(run_pass(args, [engine, gateway, *([traced] if traced else [])], concurrency))
        result["direct"][key], result["gateway"][key] = summarize(engine), summarize(gateway)
        result["ratio"][key] = compare(result["direct"][key], result["gateway"][key])
        if traced is not None:
            result["traced"][key] = summarize(traced)
            result["tracing"][key] = {**compare(result["gateway"][key], result["traced"][key]),
                                      "server_cpu_ms_per_request_added": round(
                                          result["traced"][key]["server_cpu_ms_per_request"]
                                          - result["gateway"][key]["server_cpu_ms_per_request"], 3)}
    low, high = result["ratio"]["c1"], result["ratio"][f"c{args.concurrency}"]
    added = [v for v in (low["ttft_p50_added_ms"], low["e2e_p50_added_ms"]) if v is not None]
    result["targets"] = {"added_p50_ms_lt_2": bool(added) and max(added) < 2.0,
                         "throughput_ratio_ge_0_8": high["throughput"] >= 0.8}
    if traced is not None:
        low = result["tracing"]["c1"]
        added = [v for v in (low["ttft_p50_added_ms"], low["e2e_p50_added_ms"]) if v is not None]
        result["targets"]["tracing_added_p50_ms_lt_0_2"] = bool(added) and max(added) < 0.2
    return result


def start_traced(args: argparse.Namespace, tmp: Path, config: Path, procs: list[subprocess.Popen[bytes]]
                 ) -> tuple[int, int]:
    """The OTLP/HTTP sink and a second gateway on `config` plus `[gateway.tracing]` exporting to it, started (appended
    to `procs`, sink first); returns the gateway's port and pid."""
    sink_port, port = free_port(), free_port()
    procs.append(start([sys.executable, "-m", "cascade.testing.otlp", "--port", str(sink_port)], tmp / "sink.log"))
    wait_http(f"http://127.0.0.1:{sink_port}/", procs[-1], tmp / "sink.log")
    traced = tmp / "traced.toml"
    traced.write_text(f'[gateway.tracing]\nendpoint = "http://127.0.0.1:{sink_port}/v1/traces"\nsampler_ratio = 1.0\n\n'
                      + config.read_text())
    procs.append(start([*CASCADE, "serve", "--config", str(traced), "--port", str(port), "--log-level", "warning",
                        "--processes", str(args.gateway_processes)], tmp / "traced.log"))
    wait_http(f"http://127.0.0.1:{port}/ready", procs[-1], tmp / "traced.log")
    return port, procs[-1].pid


def main() -> int:
    args = parse_args()
    engine_port, gateway_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="cascade-bench-") as tmp:
        config, logs = Path(tmp) / "cascade.toml", (Path(tmp) / "engine.log", Path(tmp) / "gateway.log")
        backend = f'{{kind = "openai", url = "http://127.0.0.1:{engine_port}", model = "fake-model"}}'
        config.write_text(f"[gateway.limits]\nmax_in_flight = {max(4 * args.concurrency, 1024)}\n\n"
                          f'[[tiers]]\nname = "bench"\nbackends = [{backend}]\n')
        try:
            procs.append(start([*CASCADE, "fake-server", "--port", str(engine_port), "--ttft-ms", str(args.ttft_ms),
                                "--itl-ms", str(args.itl_ms), "--tokens", str(args.tokens)], logs[0]))
            wait_http(f"http://127.0.0.1:{engine_port}/health", procs[0], logs[0])
            procs.append(start([*CASCADE, "serve", "--config", str(config), "--port", str(gateway_port),
                                "--log-level", "warning", "--processes", str(args.gateway_processes)], logs[1]))
            wait_http(f"http://127.0.0.1:{gateway_port}/ready", procs[1], logs[1])
            url = "http://127.0.0.1:{}/v1/chat/completions"
            traced = start_traced(args, Path(tmp), config, procs) if args.tracing else None
            result = measure(args, Target(url.format(engine_port), "fake-model", procs[0].pid, args.tokens),
                             Target(url.format(gateway_port), args.model, procs[1].pid, args.tokens),
                             None if traced is None else Target(url.format(traced[0]), args.model, traced[1],
                                                                args.tokens))
        finally:
            for proc in reversed(procs):
                stop(proc, grace_s=12)  # uvicorn's own grace is 10 s (the traced gateway flushes its spans first)
        if args.tracing:  # the sink prints what it received when it stops
            sink_log = (Path(tmp) / "sink.log").read_text()
            received = re.search(r"spans received: (\d+) in (\d+) requests", sink_log)
            result["tracing_sink"] = {"spans": int(received.group(1)), "exports": int(received.group(2))} \
                if received else {"error": sink_log[-500:]}
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
