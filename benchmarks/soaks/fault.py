"""Fault soak: chat load through the gateway while a seeded schedule breaks one engine replica at a time.

Method
  * 4 fake engines (`cascade fake-server`, deterministic answer "t0 t1 ... t{T-1} ", finish `stop`) and a
    gateway (`cascade serve`) with 2 tiers of 2 replicas each, all subprocesses on free 127.0.0.1 ports in
    their own process groups, killed in `finally` (Ctrl-C and SIGTERM included). Every wait is bounded.
  * `--n` requests, `--concurrency` in flight, half streamed, models `cascade:fast`, `cascade:best` and the
    two tier names, in a seeded order; each request has a client timeout (`--client-timeout-s`).
  * Every `--fault-every-s` a seeded (mode, replica) pair breaks for `--fault-duration-s`, then is cleared:
    engine faults through `POST /fake/script` (`{"fault": MODE}` / `{"fault": ""}`, `status_500`:
    `{"status": 500}` / `{"status": 200}`); `down`: the replica is killed and later restarted on its port;
    `garbage`: it is replaced by `cascade fake-server --fault garbage` (non-HTTP bytes), later swapped back.
  * Each request is one of: `ok_correct` (200, the full answer, finish `stop`, and for a stream `[DONE]`),
    `broken_success` (200 without an error but not that: the number that must be 0), `error_reported` (an
    error status with an OpenAI error object, or an in-band `{"error": ...}` event), `hung` (the client
    timeout fired), `lost` (the connection failed or was cut without a status or an error); the verdict and
    the soak loop are cascade/testing/soak.py's, shared with benchmarks/soaks/scaleout.py.

Output: one JSON object on stdout (and in `--out`): the counts, `served_by_failover` (share of ok_correct
whose `cascade` object has `retries` > 0 or `fallback_from`), `failover_added_latency_ms_p99`,
`faults_injected` (and `fault_log`: when, what, where), `faults_served_by_engines` (the engines' own
counts; a restart resets them), `duration_s`, `gateway_metrics` (error, request, breaker and retry lines
of /metrics) and up to 3 `samples` of what the client saw per failure kind.
Usage: .venv/bin/python -m benchmarks.soaks.fault [--n 10000] [--concurrency 32] [--seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from cascade.engines.supervisor import free_port
from cascade.testing.processes import CASCADE, start, stop
from cascade.testing.scripts import print_result
from cascade.testing.soak import KINDS, Outcome, counts, keep_in_flight, send_chat

SCRIPT_FAULTS = ("html", "malformed_sse", "truncated", "stall_first_byte", "stall_mid", "kill_mid")
MODES = (*SCRIPT_FAULTS, "status_500", "down", "garbage")
TIERS = ("small", "large")
MODELS = ("cascade:fast", "cascade:best", *TIERS)


class Proc:
    """A `cascade` subprocess in its own process group, logging to `log`."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str] | None = None) -> None:
        self.popen = start([*CASCADE, *(argv or self.argv)], self.log, append=True)

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> None:
        if self.popen is None:
            return
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(5)

    def kill(self) -> None:
        if self.popen is not None:
            stop(self.popen, grace_s=0)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""


async def wait_until(check, proc: Proc, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{what}: exited with {proc.popen.returncode}:\n{proc.tail()}")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if await check():
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what}: not ready after {timeout_s:g} s:\n{proc.tail()}")


async def http_ok(control: httpx.AsyncClient, url: str) -> bool:
    return (await control.get(url)).status_code == 200


async def tcp_open(port: int) -> bool:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    return True


def gateway_toml(ports: list[int], tokens: int, port: int) -> str:
    timeouts = "{ connect_s = 1.0, read_s = 2.0, total_s = 10.0 }"
    tiers = []
    for t, name in enumerate(TIERS):
        backends = ",\n  ".join(f'{{ kind = "openai", url = "http://127.0.0.1:{p}", model = "fake-{name}", '
                                f"timeouts = {timeouts} }}" for p in ports[2 * t:2 * t + 2])
        tiers.append(f'[[tiers]]\nname = "{name}"\ndefault_max_tokens = {tokens + 16}\nscorer = "none"\n'
                     f"backends = [\n  {backends},\n]\n")
    return f'[gateway]\nhost = "127.0.0.1"\nport = {port}\n\n' + "\n".join(tiers)


class Replica:
    def __init__(self, name: str, port: int, tokens: int, itl_ms: float, log_dir: Path) -> None:
        self.name, self.port = name, port
        self.normal = ["fake-server", "--host", "127.0.0.1", "--port", str(port), "--tokens", str(tokens),
                       "--itl-ms", str(itl_ms), "--model", name]
        self.proc = Proc(self.normal, log_dir / f"{name}.log")
        self.url = f"http://127.0.0.1:{port}"

    async def restart(self, control: httpx.AsyncClient, garbage: bool = False) -> None:
        self.proc.kill()
        if garbage:
            self.proc.start(["fake-server", "--host", "127.0.0.1", "--port", str(self.port), "--fault", "garbage"])
            await wait_until(lambda: tcp_open(self.port), self.proc, f"{self.name} (garbage)")
        else:
            self.proc.start()
            await wait_until(lambda: http_ok(control, f"{self.url}/health"), self.proc, self.name)


async def inject(mode: str, replica: Replica, control: httpx.AsyncClient, clear: bool) -> None:
    if mode in SCRIPT_FAULTS:
        await control.post(f"{replica.url}/fake/script", json={"fault": "" if clear else mode})
    elif mode == "status_500":
        await control.post(f"{replica.url}/fake/script", json={"status": 200 if clear else 500})
    elif mode == "down" and not clear:
        replica.proc.kill()
    else:  # down (clear) and garbage
        await replica.restart(control, garbage=mode == "garbage" and not clear)


async def fault_schedule(replicas: list[Replica], modes: list[str], rng: np.random.Generator, every_s: float,
                         duration_s: float, control: httpx.AsyncClient, log: list[str]) -> None:
    """One fault at a time, forever (the caller cancels it): wait, break a replica, wait, clear it. Modes
    come in seeded rounds (each mode once per round), replicas uniformly at random."""
    started = time.perf_counter()
    while True:
        for m in rng.permutation(len(modes)):
            await asyncio.sleep(max(0.0, every_s - duration_s))
            mode, replica = modes[int(m)], replicas[int(rng.integers(len(replicas)))]
            log.append(f"{time.perf_counter() - started:.2f}s {mode} {replica.name}")
            await inject(mode, replica, control, clear=False)
            await asyncio.sleep(duration_s)
            await inject(mode, replica, control, clear=True)


async def soak(args: argparse.Namespace, replicas: list[Replica], gateway: Proc, gateway_url: str) -> dict:
    this = asyncio.current_task()
    assert this is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)  # like Ctrl-C: unwind
    rng = np.random.default_rng(args.seed)
    modes = args.modes.split(",")
    plan = [(MODELS[(i // 2) % len(MODELS)], i % 2 == 0) for i in range(args.n)]
    plan = [plan[j] for j in rng.permutation(args.n)]
    expected = "".join(f"t{i} " for i in range(args.tokens))
    fault_log: list[str] = []
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=5.0) as control, \
            httpx.AsyncClient(timeout=args.client_timeout_s, limits=limits) as client:
        for replica in replicas:
            replica.proc.start()
        for replica in replicas:
            await wait_until(lambda r=replica: http_ok(control, f"{r.url}/health"), replica.proc, replica.name)
        gateway.start()
        await wait_until(lambda: http_ok(control, f"{gateway_url}/ready"), gateway, "gateway")
        started = time.perf_counter()
        schedule = asyncio.create_task(fault_schedule(replicas, modes, rng, args.fault_every_s,
                                                      args.fault_duration_s, control, fault_log))
        with tqdm(total=args.n, desc="fault soak", unit="req", mininterval=0.5) as bar:

            async def send(i: int) -> Outcome:
                model, stream = plan[i]
                body = {"model": model, "stream": stream,
                        "messages": [{"role": "user", "content": f"Say hello ({i})."}]}
                return await send_chat(client, f"{gateway_url}/v1/chat/completions", body, expected,
                                       args.client_timeout_s, label=f"{model} ")

            try:
                await keep_in_flight(send, args.n, args.concurrency, outcomes, on_each=lambda: bar.update(1))
            finally:
                schedule.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError, RuntimeError):
                    await schedule
        duration = time.perf_counter() - started
        metrics = (await control.get(f"{gateway_url}/metrics")).text
        served: Counter[str] = Counter()
        for replica in replicas:  # engines restarted by `down`/`garbage` lost their earlier counts
            with contextlib.suppress(httpx.HTTPError, ValueError):
                served.update((await control.get(f"{replica.url}/fake/stats")).json().get("faults", {}))
    return report(outcomes, fault_log, served, duration, metrics)


def failed_over(outcome: Outcome) -> bool:
    """Whether the gateway's `cascade` object says it retried or fell back to answer."""
    retries, fallback = outcome.cascade.get("retries"), outcome.cascade.get("fallback_from")
    return (isinstance(retries, int) and retries > 0) or (isinstance(fallback, str) and bool(fallback))


def report(outcomes: list[Outcome], fault_log: list[str], served: Counter[str],
           duration_s: float, metrics: str) -> dict:
    ok = [o for o in outcomes if o.kind == "ok_correct"]
    failover = [o.latency_s for o in ok if failed_over(o)]
    direct = [o.latency_s for o in ok if not failed_over(o)]
    added = None
    if failover and direct:
        added = round(1000 * (float(np.percentile(failover, 99)) - float(np.percentile(direct, 50))), 1)
    wanted = ("cascade_backend_errors", "cascade_requests")
    lines = [line for line in metrics.splitlines() if line and not line.startswith("#")
             and (line.startswith(wanted) or "breaker" in line or "retr" in line)]
    return {
        "requests": len(outcomes), **counts(outcomes),
        # 200: an error event after tokens were sent (a fault mid-stream, which cannot be retried);
        # 502/503/504: before any byte (every replica tried, or the tier benched).
        "error_reported_by_status": dict(sorted(Counter(str(o.status) for o in outcomes
                                                        if o.kind == "error_reported").items())),
        "served_by_failover": round(len(failover) / len(ok), 4) if ok else 0.0,
        "failover_added_latency_ms_p99": added,
        "faults_injected": dict(sorted(Counter(entry.split()[1] for entry in fault_log).items())),
        "faults_served_by_engines": dict(sorted(served.items())),
        "duration_s": round(duration_s, 2),
        "gateway_metrics": lines,
        "fault_log": fault_log,  # "seconds into the load, mode, replica"
        "samples": {k: [o.detail for o in outcomes if o.kind == k][:3] for k in KINDS[1:]},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="requests to send")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="request order and fault schedule")
    parser.add_argument("--fault-every-s", type=float, default=3.0, help="a new fault starts this often")
    parser.add_argument("--fault-duration-s", type=float, default=2.0, help="how long each fault lasts")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--client-timeout-s", type=float, default=30.0, help="per request, whole response")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer (fake engine --tokens)")
    parser.add_argument("--itl-ms", type=float, default=5.0, help="fake engine time between tokens")
    parser.add_argument("--out", "--json-out", dest="out", help="also write the JSON report here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.modes.split(",")) - set(MODES))
    if unknown or args.fault_duration_s > args.fault_every_s or args.n < 1 or args.concurrency < 1:
        parser.error(f"--modes: unknown {unknown}" if unknown else
                     "need --fault-duration-s <= --fault-every-s, --n >= 1 and --concurrency >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fault-soak-") as tmp:
        work = Path(tmp)
        ports = [free_port() for _ in range(4)]
        replicas = [Replica(f"{TIERS[k // 2]}-{k % 2}", port, args.tokens, args.itl_ms, work)
                    for k, port in enumerate(ports)]
        gateway_port = free_port()
        config = work / "cascade.toml"
        config.write_text(gateway_toml(ports, args.tokens, gateway_port))
        gateway = Proc(["serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(gateway_port),
                        "--log-level", "warning"], work / "gateway.log")
        procs = [gateway, *(r.proc for r in replicas)]
        try:
            result = asyncio.run(soak(args, replicas, gateway, f"http://127.0.0.1:{gateway_port}"))
        except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, SIGTERM
            return 130
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup below is bounded: let it finish
            for proc in procs:
                proc.signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(10)
    print_result(result, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
