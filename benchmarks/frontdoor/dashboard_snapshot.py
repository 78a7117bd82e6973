"""The Grafana dashboard (cascade/deploy/monitoring/dashboard.py) over a short load test, drawn as one PNG.
Prints JSON of what it drew.

Method
  * Fake engines in this process on free 127.0.0.1 ports: tier `small` on two replicas, one of which answers every
    request with a 500 (its breaker opens, requests fail over); `medium` on a fake SGLang with 4 batch slots
    (engine load read from its /metrics); `thinker` with 4 reasoning branches, stopped at 2.
  * `cascade serve` in cascade mode with load-reactive routing, prices per tier and two API keys: `team-a` with
    a budget (`--team-a-budget`; past half of it its requests are served `fast`), `team-b` with a request limit
    (`--team-b-rpm` requests a minute: some of its requests get 429).
  * Real Prometheus (Debian's `prometheus` binary: `--prometheus`, default from PATH) scrapes the gateway every
    second and evaluates cascade's alerting rules; two `cascade loadgen` runs (seeded Poisson arrivals; team-a's
    answers whole, team-b's streamed) send a prompt mix: plain questions (answered on `small`), answers cut off
    on `small` (escalated to `medium`) or on both (escalated to `thinker`), and a few of those that then fail on
    `thinker` (502).
  * Then each dashboard panel's queries go to Prometheus' query_range API over the run, with Grafana's
    `$__rate_interval` set to `--rate-window` (what Grafana would use at a wider step), and are drawn in a grid
    titled as in the dashboard. Rows with no data in this setup (Redis, the Envoy model picker) are left out
    and listed. Grafana itself does not run here.

Usage: .venv/bin/python -m benchmarks.frontdoor.dashboard_snapshot [--duration-s 75] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cascade.deploy.monitoring import RULES_FILE, dashboard
from cascade.deploy.monitoring import write as write_monitoring
from cascade.engines.supervisor import free_port
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.processes import CASCADE, process, start, stop
from cascade.testing.scripts import fail, print_result
from cascade.testing.servers import serve_config
from cascade.testing.waiting import wait_http

KEYS = {"team-a": "csk-dashboard-team-a-0123456789abcdef", "team-b": "csk-dashboard-team-b-0123456789abcdef"}
CONFIG = """
[routing]
mode = "cascade"

[routing.load]
enabled = true
ttft_ms = 600
e2el_ms = 3000

[routing.engine_load]
poll_s = 0.5

[[gateway.keys]]
name = "team-a"
sha256 = "{a}"
budget = {team_a_budget}
budget_period = "day"
downgrade_at = 0.5

[[gateway.keys]]
name = "team-b"
sha256 = "{b}"
requests_per_minute = {team_b_rpm}

[[tiers]]
name = "small"
default_max_tokens = 32
price = {{ input_per_mtok = 0.1, output_per_mtok = 0.4 }}
backends = [{{ kind = "openai", url = "{small}", model = "fake-small" }},
            {{ kind = "openai", url = "{broken}", model = "fake-small" }}]

[[tiers]]
name = "medium"
default_max_tokens = 32
price = {{ input_per_mtok = 0.5, output_per_mtok = 2.0 }}
backends = [{{ kind = "sglang", url = "{medium}", model = "fake-medium" }}]

[[tiers]]
name = "thinker"
default_max_tokens = 32
branches = {{ n = 4, m = 2 }}
price = {{ input_per_mtok = 2.0, output_per_mtok = 8.0 }}
backends = [{{ kind = "openai", url = "{thinker}", model = "fake-thinker" }}]
"""
# (share, directive): what each prompt asks the fake engines to do.
_CUT = "[fake@fake-small tokens=100]", "[fake@fake-medium tokens=100]"
MIX = ((0.55, ""), (0.25, _CUT[0]), (0.15, " ".join(_CUT)), (0.05, " ".join([*_CUT, "[fake@fake-thinker status=500]"])))


def write_dataset(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shares = np.array([s for s, _ in MIX])
    with path.open("w") as out:
        for i, pick in enumerate(rng.choice(len(MIX), size=n, p=shares / shares.sum())):
            a, b = rng.integers(2, 99, size=2)
            out.write(json.dumps({"id": str(i), "prompt": f"{MIX[pick][1]} What is {a} + {b}?".strip()}) + "\n")


def prometheus_config(path: Path, target: str, rules: Path) -> None:
    # JSON is YAML.
    path.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "cascade", "static_configs": [{"targets": [target]}]}]}))


def query_range(prom: str, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
    response = httpx.get(f"{prom}/api/v1/query_range", params={"query": expr, "start": start, "end": end,
                                                               "step": step_s}, timeout=30)
    body = response.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    return list(body["data"]["result"])


def legend(template: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        template = template.replace(f"{{{{{key}}}}}", value)
    return template


_SCALE = {"s": (1000.0, "ms"), "percentunit": (100.0, "%"), "reqps": (1.0, "req/s"), "ops": (1.0, "/s")}


def draw(panels: list[tuple[dashboard.Panel, list[tuple[str, np.ndarray, np.ndarray]]]], out: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    columns = 4
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    end_s = max((float(t[-1]) for _, series in panels for _, t, _ in series if len(t)), default=1.0)
    for ax, (p, series) in zip(axes.flat, panels, strict=False):
        ax.set_xlim(0, end_s)
        scale, unit = _SCALE.get(p.unit, (1.0, ""))
        for name, t, v in sorted(series, key=lambda s: -np.nanmax(s[2]) if len(s[2]) else 0)[:8]:
            ax.plot(t, v * scale, linewidth=1, label=name)
        ax.set_title(p.title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_ylabel(unit, fontsize=7)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=6, loc="upper left", frameon=False, ncol=2)
    for ax in axes[-1]:
        ax.set_xlabel("s into the run", fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=62)
    plt.close(fig)
    # A palette of 256 colours: the same picture at a third of the bytes.
    Image.open(out).convert("RGB").quantize(colors=256).save(out, optimize=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    prometheus = args.prometheus or shutil.which("prometheus")
    if prometheus is None:
        raise FileNotFoundError("no `prometheus` binary: install Debian's prometheus package, or pass --prometheus")
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dashboard-")))
        engine = FakeScript(tokens=24, ttft_ms=40, itl_ms=8)
        small = stack.enter_context(serve_asgi(FakeEngine(engine)))
        broken = stack.enter_context(serve_asgi(FakeEngine(FakeScript(status=500))))
        medium = stack.enter_context(serve_asgi(FakeSGLang(FakeScript(tokens=24, ttft_ms=120, itl_ms=15),
                                                           max_running=4)))
        thinker = stack.enter_context(serve_asgi(FakeEngine(FakeScript(tokens=24, ttft_ms=200, itl_ms=20))))
        digests = {name: hashlib.sha256(key.encode()).hexdigest() for name, key in KEYS.items()}
        served = stack.enter_context(serve_config(tmp, CONFIG.format(
            a=digests["team-a"], b=digests["team-b"], team_b_rpm=args.team_b_rpm, team_a_budget=args.team_a_budget,
            small=small, broken=broken, medium=medium, thinker=thinker)))
        write_monitoring(tmp / "monitoring")
        prometheus_config(tmp / "prometheus.yml", served.url.removeprefix("http://"), tmp / "monitoring" / RULES_FILE)
        prom_port = free_port()
        prom = f"http://127.0.0.1:{prom_port}"
        prom_proc = stack.enter_context(process(
            [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"], tmp / "prometheus.log"))
        wait_http(f"{prom}/-/ready", prom_proc, tmp / "prometheus.log", 60)

        started = time.time()
        runs = {}
        for i, (key, rate, stream) in enumerate((("team-a", args.rate, False), ("team-b", args.team_b_rate, True))):
            dataset = tmp / f"{key}.jsonl"
            write_dataset(dataset, n=int(rate * args.duration_s * 2) + 10, seed=args.seed + i)
            runs[key] = start([*CASCADE, "loadgen", "--url", served.url, "--dataset", str(dataset), "--rate",
                               str(rate), "--duration-s", str(args.duration_s), "--model", "cascade",
                               "--quality-mix", "fast=0.3,balanced=0.5,best=0.2", "--seed", str(args.seed + i),
                               "--api-key", KEYS[key], "--timeout-s", "30", "--drain-s", "30", "--no-progress",
                               "--out", str(tmp / f"loadgen-{key}"), "--json", *([] if stream else ["--no-stream"])],
                              tmp / f"loadgen-{key}.log")
        summaries = {}
        for key, proc in runs.items():
            if proc.wait(timeout=args.duration_s + 120) != 0:
                raise RuntimeError(f"loadgen ({key}) failed: {(tmp / f'loadgen-{key}.log').read_text()[-2000:]}")
            summary = json.loads((tmp / f"loadgen-{key}" / "summary.json").read_text())
            summaries[key] = {k: summary.get(k) for k in ("requests", "completed", "failed", "achieved_rate_rps")}
        time.sleep(3)  # the last scrapes
        ended = time.time()
        alerts = httpx.get(f"{prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"]

        drawn, empty_rows, points = [], [], 0
        for row in dashboard.ROWS:
            row_panels = []
            for p in row.panels:
                series = []
                for q in p.queries:
                    expr = q.expr.replace(dashboard.RATE, args.rate_window)
                    for result in query_range(prom, expr, started, ended, args.step_s):
                        values = np.array([[float(t), float(v)] for t, v in result["values"]])
                        series.append((legend(q.legend, result["metric"]), values[:, 0] - started, values[:, 1]))
                        points += len(values)
                row_panels.append((p, series))
            if any(series for _, series in row_panels):
                drawn += row_panels
            else:
                empty_rows.append(row.title)
        stop(prom_proc, grace_s=5)
    title = (f"cascade gateway dashboard over {args.duration_s:g} s of loadgen on fake engines "
             f"(Prometheus, rate window {args.rate_window})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draw(drawn, args.out, title)
    return {"duration_s": round(ended - started, 1), "loadgen": summaries,
            "panels": [{"title": p.title, "series": len(s),
                        "peak": round(max((float(np.nanmax(v)) for _, _, v in s if len(v)), default=0.0), 4)}
                       for p, s in drawn],
            "rows_without_data": empty_rows, "points": points,
            "alerts": sorted({(a["labels"]["alertname"], a["state"]) for a in alerts}),
            "png": str(args.out), "png_bytes": args.out.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=75.0)
    parser.add_argument("--rate", type=float, default=4.0, help="team-a's requests per second")
    parser.add_argument("--team-b-rate", type=float, default=1.5, help="team-b's requests per second")
    parser.add_argument("--team-b-rpm", type=int, default=30, help="team-b's request limit per minute")
    parser.add_argument("--team-a-budget", type=float, default=0.05,
                        help="team-a's budget a day (price units): past half of it, its requests are served `fast`")
    parser.add_argument("--rate-window", default="15s", help="what $__rate_interval stands for")
    parser.add_argument("--step-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prometheus", help="the prometheus binary (default: from PATH)")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    try:
        result = run(args)
    except (FileNotFoundError, RuntimeError) as exc:
        return fail(str(exc))
    print_result(result, args.json_out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
