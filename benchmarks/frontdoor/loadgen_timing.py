"""Is loadgen's timing trustworthy? Open-loop load against the fake engine, measured three ways.

Method
  * `cascade fake-server` (scripted TTFT/ITL/tokens) runs as a subprocess on a free 127.0.0.1 port,
    in its own process group, killed in `finally`; every wait is bounded.
  * Each client runs in its own fresh subprocess, one after the other, against the same server:
      - `loadgen-uvloop` / `loadgen-asyncio`: loadgen's own client (absolute schedule, protocol-level
        timestamps), on uvloop and on the stdlib event loop;
      - `vllm-aiohttp`: a `vllm bench serve`-style client: aiohttp with one shared session, chunks read
        with `response.content` line by line and `json.loads`, a task per request, and vLLM's
        schedule: gamma gaps normalized to n/rate and slept relative to a start time;
      - `vllm-aiohttp-classic` (with --classic): the older benchmark_serving.py loop that sleeps each
        sampled gap after yielding a request (lateness accumulates).
    A discarded 3 s warm-up at full rate comes first; then a light calibration pass (loadgen-uvloop at
    10 rps) shows the floor that the server and the loopback add to TTFT/ITL when nothing is loaded.
  * The server is the fake engine wrapped to timestamp its own frames (`Instrumented`): server-side
    TTFT (ASGI call -> first body frame) and ITL (between frames). `*_over_server_ms_p50` is what the
    client measured beyond what the server did: loopback + uvicorn parsing + the client's own error.
  * Per client: achieved rate = (n - 1) / (last send - first send) against the target; dispatch lag
    = actual send time - scheduled send time (vLLM-style clients: the time just before `post`; loadgen:
    the time the request bytes were written, which is later); measured TTFT/ITL against the script.
  * Checks (issue 4): achieved rate within 2% of the target, dispatch lag p99 < 5 ms, and measured
    TTFT/ITL within 1 ms of the scripted values (compared at the median; p99 is reported too).

Output: one JSON object on stdout.
Usage: .venv/bin/python -m benchmarks.frontdoor.loadgen_timing [--rate 500] [--duration-s 20] [--classic] [--nice -10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cascade.engines.supervisor import free_port
from cascade.testing.processes import process
from cascade.testing.scripts import print_result
from cascade.testing.waiting import wait_http

ROOT = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.frontdoor.loadgen_timing"  # its server and clients are this module in subprocesses


# --- the server ---------------------------------------------------------------------------------

class Instrumented:
    """The fake engine, unchanged, wrapped to record what it actually did: per streamed request, the
    time from the ASGI call to its first body frame (server-side TTFT) and between body frames
    (server-side ITL), from the server's own clock. `GET /bench/stats` returns them and resets."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.ttft: list[float] = []
        self.itl: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/bench/stats":
            from cascade.engines.asgi import send_json

            stats = {"ttft_ms": self.ttft, "itl_ms": self.itl}
            self.ttft, self.itl = [], []
            await send_json(send, 200, stats)
            return
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        frames: list[float] = []

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("more_body"):
                frames.append(time.perf_counter())
            await send(message)

        await self.app(scope, receive, timed_send)
        if frames:
            self.ttft.append((frames[0] - start) * 1000)
            self.itl.extend((b - a) * 1000 for a, b in itertools.pairwise(frames))


def serve_instrumented(port: int, ttft_ms: float, itl_ms: float, tokens: int) -> None:
    import uvicorn

    from cascade.testing.fakes.engine import FakeEngine, FakeScript

    app = Instrumented(FakeEngine(FakeScript(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens=tokens)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def server_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/bench/stats", timeout=30) as response:
        raw = json.loads(response.read())
    out = {}
    for key in ("ttft_ms", "itl_ms"):
        a = np.array(raw[key])
        out[key] = {"p50": round(float(np.median(a)), 3), "p99": round(float(np.percentile(a, 99)), 3),
                    "mean": round(float(a.mean()), 3)} if len(a) else None
    return out


@contextlib.contextmanager
def fake_server(ttft_ms: float, itl_ms: float, tokens: int, nice: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    cmd = [sys.executable, "-m", MODULE, "--serve", str(port), "--ttft-ms", str(ttft_ms),
           "--itl-ms", str(itl_ms), "--tokens", str(tokens), "--nice", str(nice)]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="loadgen-timing-") as tmp, \
            process(cmd, Path(tmp) / "fake.log", cwd=ROOT, grace_s=5) as proc:
        try:
            wait_http(f"{url}/health", proc, Path(tmp) / "fake.log", timeout_s=20)
        except RuntimeError as exc:
            raise RuntimeError(f"fake server did not start: {exc}") from None
        yield url, proc.pid


# --- measurements common to every client ---------------------------------------------------------

def report(name: str, rate: float, scheduled: list[float], sent: list[float | None], ttft: list[float],
           itl: list[float], failed: int, script: dict[str, float], cpu_s: float) -> dict[str, Any]:
    """Times in seconds relative to the schedule start; ttft/itl in seconds."""
    s = np.array([x for x in sent if x is not None])
    lag_ms = np.array([(a - b) * 1000 for a, b in zip(sent, scheduled, strict=True) if a is not None])
    achieved = (len(s) - 1) / (s.max() - s.min()) if len(s) > 1 else 0.0
    tt, it = np.array(ttft) * 1000, np.array(itl) * 1000

    def pct(a: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(a, q)), 3) if len(a) else None

    return {
        "client": name,
        "requests": len(sent), "failed": failed,
        "target_rate_rps": rate,
        "achieved_rate_rps": round(achieved, 2),
        "achieved_over_target": round(achieved / rate, 4),
        "dispatch_lag_ms": {"p50": pct(lag_ms, 50), "p99": pct(lag_ms, 99), "max": pct(lag_ms, 100)},
        "ttft_ms": {"p50": pct(tt, 50), "p99": pct(tt, 99), "mean": round(float(tt.mean()), 3) if len(tt) else None},
        "itl_ms": {"p50": pct(it, 50), "p99": pct(it, 99), "mean": round(float(it.mean()), 3) if len(it) else None},
        "ttft_error_ms_p50": None if not len(tt) else round(float(np.median(tt)) - script["ttft_ms"], 3),
        "itl_error_ms_p50": None if not len(it) else round(float(np.median(it)) - script["itl_ms"], 3),
        "itl_error_ms_mean": None if not len(it) else round(float(it.mean()) - script["itl_ms"], 3),
        "client_cpu_s": round(cpu_s, 2),
    }


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- client 1: loadgen ---------------------------------------------------------------------------

def run_loadgen(url: str, rate: float, n: int, loop: str, seed: int, script: dict[str, float]) -> dict[str, Any]:
    from loadgen.run import LoadConfig, run_load

    cpu0 = cpu_seconds()
    cfg = LoadConfig(url=url, dataset="random:16", rate=rate, n=n, arrival="poisson", seed=seed,
                     event_loop=loop, progress=False, model="fake-model")
    _, records = run_load(cfg)
    return report(f"loadgen-{loop}", rate, [r.scheduled_s for r in records], [r.sent_s for r in records],
                  [r.ttft_ms / 1000 for r in records if r.ttft_ms is not None],
                  [x / 1000 for r in records for x in r.itl_ms], sum(1 for r in records if r.error), script,
                  cpu_seconds() - cpu0)


# --- client 2: vllm bench serve style (aiohttp) --------------------------------------------------

async def _vllm_style(url: str, rate: float, n: int, seed: int, classic: bool,
                      ) -> tuple[list[float], list[float | None], list[float], list[float], int]:
    import aiohttp

    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=1.0, scale=1.0 / rate, size=n)
    words = " ".join(["alpha"] * 16)
    payload = {"model": "fake-model", "messages": [{"role": "user", "content": words}], "stream": True,
               "stream_options": {"include_usage": True}, "max_tokens": 4096}
    if classic:
        delays = None
    else:  # vLLM >= 0.10: cumulative delays normalized so the last request is at n/rate, absolute sleeps
        delays = np.cumsum(gaps)
        delays = delays * ((n / rate) / delays[-1])
        delays = np.concatenate([[0.0], delays[:-1]])
    scheduled: list[float] = [0.0] * n
    sent: list[float | None] = [None] * n
    ttfts: list[float] = []
    itls: list[float] = []
    failed = 0
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def request(i: int, start: float) -> None:
            nonlocal failed
            st = time.perf_counter()
            sent[i] = st - start
            ttft = 0.0
            last = st
            try:
                async with session.post(f"{url}/v1/chat/completions", json=payload) as response:
                    if response.status != 200:
                        failed += 1
                        return
                    async for chunk_bytes in response.content:
                        chunk_bytes = chunk_bytes.strip()
                        if not chunk_bytes:
                            continue
                        chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
                        if chunk == "[DONE]":
                            continue
                        timestamp = time.perf_counter()
                        data = json.loads(chunk)
                        if data.get("choices"):  # as vLLM: every choices chunk is a token event
                            if ttft == 0.0:
                                ttft = timestamp - st
                                ttfts.append(ttft)
                            else:
                                itls.append(timestamp - last)
                        last = timestamp
            except aiohttp.ClientError:
                failed += 1

        tasks = []
        start = time.perf_counter()
        for i in range(n):
            if delays is None:  # classic: yield, then sleep the sampled gap
                scheduled[i] = float(np.sum(gaps[:i]))
                tasks.append(asyncio.create_task(request(i, start)))
                await asyncio.sleep(gaps[i])
            else:
                scheduled[i] = float(delays[i])
                wait = delays[i] - (time.perf_counter() - start)
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(request(i, start)))
        await asyncio.gather(*tasks)
    return scheduled, sent, ttfts, itls, failed


def run_vllm_style(url: str, rate: float, n: int, seed: int, classic: bool, script: dict[str, float]) -> dict[str, Any]:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return {"client": "vllm-aiohttp", "skipped": "aiohttp is not installed (pip install aiohttp)"}
    cpu0 = cpu_seconds()
    scheduled, sent, ttfts, itls, failed = asyncio.run(_vllm_style(url, rate, n, seed, classic))
    name = "vllm-aiohttp-classic" if classic else "vllm-aiohttp"
    return report(name, rate, scheduled, sent, ttfts, itls, failed, script, cpu_seconds() - cpu0)


# --- orchestration -------------------------------------------------------------------------------

def worker(args: argparse.Namespace) -> None:
    script = {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms}
    n = int(args.rate * args.duration_s)
    if args.worker.startswith("loadgen-"):
        result = run_loadgen(args.url, args.rate, n, args.worker.removeprefix("loadgen-"), args.seed, script)
    else:
        result = run_vllm_style(args.url, args.rate, n, args.seed, args.worker.endswith("classic"), script)
    print_result(result, None, indent=None)  # one line: the parent reads it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=5.0)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--classic", action="store_true", help="also run the older relative-sleep vLLM loop")
    parser.add_argument("--clients", default="loadgen-uvloop,loadgen-asyncio,vllm-aiohttp")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--nice", type=int, default=0,
                        help="niceness for the server and client processes (negative needs root): on a shared "
                        "machine, isolates the measurement from other tenants' CPU load; reported in the output")
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    if args.nice and (args.serve or args.worker):
        os.nice(args.nice)
    if args.serve:
        serve_instrumented(args.serve, args.ttft_ms, args.itl_ms, args.tokens)
        return
    if args.worker:
        worker(args)
        return
    clients = args.clients.split(",") + (["vllm-aiohttp-classic"] if args.classic else [])
    out: dict[str, Any] = {"config": {"rate_rps": args.rate, "duration_s": args.duration_s, "ttft_ms": args.ttft_ms,
                                      "itl_ms": args.itl_ms, "tokens": args.tokens, "cores": os.cpu_count(),
                                      "server": "cascade fake-server (uvicorn) in its own process"}}
    out["config"]["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    out["config"]["nice"] = args.nice
    with fake_server(args.ttft_ms, args.itl_ms, args.tokens, args.nice) as (url, _):
        # A discarded warm-up at full rate first (the server's first seconds at 500 rps are slower),
        # then the light calibration, then each client.
        passes = [("warmup", "loadgen-asyncio", args.rate, 3.0), ("calibration", "loadgen-uvloop", 10.0, 3.0)]
        passes += [(c, c, args.rate, args.duration_s) for c in clients]
        results: dict[str, Any] = {}
        for label, client, rate, duration in passes:
            cmd = [sys.executable, "-m", MODULE, "--worker", client, "--url", url, "--rate", str(rate),
                   "--duration-s", str(duration), "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
                   "--seed", str(args.seed), "--nice", str(args.nice)]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=duration * 10 + 120)
            if done.returncode != 0:
                results[label] = {"client": client, "error": done.stderr.strip().splitlines()[-1:]}
            else:
                results[label] = json.loads(done.stdout.strip().splitlines()[-1])
                server = server_stats(url)
                results[label]["server_side"] = server
                # What the client adds on top of what the server actually did (transport + measurement).
                r = results[label]
                if server["ttft_ms"] and r["ttft_ms"]["p50"] is not None:
                    r["ttft_over_server_ms_p50"] = round(r["ttft_ms"]["p50"] - server["ttft_ms"]["p50"], 3)
                if server["itl_ms"] and r["itl_ms"]["p50"] is not None:
                    r["itl_over_server_ms_p50"] = round(r["itl_ms"]["p50"] - server["itl_ms"]["p50"], 3)
                    r["itl_over_server_ms_mean"] = round(r["itl_ms"]["mean"] - server["itl_ms"]["mean"], 3)
            print(f"{label}: done", file=sys.stderr)
    out["config"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results.pop("warmup", None)
    out["results"] = results
    out["checks"] = {
        label: {
            "rate_within_2pct": abs(r["achieved_over_target"] - 1) <= 0.02,
            "lag_p99_below_5ms": r["dispatch_lag_ms"]["p99"] < 5.0,
            "ttft_within_1ms_of_script": abs(r["ttft_error_ms_p50"]) <= 1.0,
            "itl_within_1ms_of_script": abs(r["itl_error_ms_p50"]) <= 1.0,
            "ttft_within_1ms_of_server": abs(r.get("ttft_over_server_ms_p50", 99)) <= 1.0,
            "itl_within_1ms_of_server": abs(r.get("itl_over_server_ms_p50", 99)) <= 1.0,
        }
        for label, r in results.items() if label != "calibration" and "achieved_over_target" in r
    }
    print_result(out, args.json_out, indent=2)


if __name__ == "__main__":
    main()
