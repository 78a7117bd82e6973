"""`cascade loadgen`: argparse wiring only (the load generator is imported when the command runs)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_USAGE = 2
CONTRACT_KEYS = ("requests", "completed", "failed", "achieved_rate_rps", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms",
                 "goodput_rps", "slo_attainment", "accuracy")


def add_loadgen_command(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "loadgen", help="open-loop load test of any OpenAI-compatible endpoint, with an SLO report",
        description="Send chat requests to URL on a seeded arrival schedule (or with fixed concurrency), "
        "measure TTFT/ITL/TPOT/E2E latency per request, grade answers against references, and write "
        "requests.jsonl, summary.json, report.md and PNG plots to --out. `cascade loadgen compare RUN_A RUN_B` "
        "puts two such runs side by side.",
    )
    # --url, --dataset and --out are required for a load test; argparse cannot require them only when no
    # sub-action is given, so run_command checks them (same message, exit 2).
    p.add_argument("--url", help="base URL of the server, e.g. http://127.0.0.1:8000 (required)")
    p.add_argument("--dataset",
                   help="sharegpt | gsm8k | gsm8k-train | routellm-gsm8k | routellm-mmlu[:SUBJECT] | "
                   "random[:WORDS] | FILE.jsonl (prompt, optional reference) | FILE.csv (prompt column)")
    p.add_argument("--rate", type=float, help="offered requests per second (open loop); with --arrival trace: "
                   "rescale the trace to this mean rate")
    p.add_argument("--arrival", default="poisson", choices=["poisson", "gamma", "constant", "trace"])
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape: 1 = Poisson, < 1 burstier, > 1 smoother (implies --arrival gamma if not 1)")
    p.add_argument("--trace",
                   help="BurstGPT-format CSV (Timestamp, Request tokens, Response tokens) for --arrival trace")
    p.add_argument("--n", type=int, help="number of requests (default 100 unless --duration-s is given)")
    p.add_argument("--duration-s", type=float, help="stop sending after this many seconds")
    p.add_argument("--concurrency", type=int, help="closed loop: keep this many requests in flight instead of a rate")
    p.add_argument("--slo", help="latency SLO in ms, e.g. ttft_ms=500,tpot_ms=50,e2el_ms=10000")
    p.add_argument("--quality-mix",
                   help="quality hint per request, e.g. fast=0.5,best=0.5 (sent as body field `quality`)")
    p.add_argument("--model", help="model name to send (default: the first id from GET /v1/models)")
    p.add_argument("--max-tokens", type=int,
                   help="max output tokens per request (ShareGPT/trace items use the smaller)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests (TTFT is then the full latency)")
    p.add_argument("--seed", type=int, default=0, help="seed for arrivals, sampling and the quality mix")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout (recorded as an error)")
    p.add_argument("--drain-s", type=float, help="after the last send, wait at most this long for responses")
    p.add_argument("--no-normalize", action="store_true",
                   help="do not rescale random arrivals so that the n-th request falls at (n-1)/rate")
    p.add_argument("--sweep", metavar="RATES", help="rate sweep: 1,2,4,8 or START:STOP:STEP; stops when SLO "
                   "attainment falls below --attainment-target and reports the maximum sustainable rate")
    p.add_argument("--sweep-refine", type=int, default=0,
                   help="bisection steps between the last good and first bad rate")
    p.add_argument("--attainment-target", type=float, default=0.9,
                   help="SLO attainment a sweep must keep (default 0.9)")
    p.add_argument("--attainment-level", type=float, default=0.95,
                   help="attainment for the minimum-SLO-scale metric (Cascadia uses 0.95)")
    p.add_argument("--api-key", help="sent as `Authorization: Bearer KEY`")
    p.add_argument("--data-dir", help="shared data folder (default: $CASCADE_SHARED_DATA or ../shared/data)")
    p.add_argument("--event-loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                   help="auto: uvloop when installed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--out",
                   help="run directory (created): requests.jsonl, summary.json, report.md, PNGs (required)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=run_command)
    actions = p.add_subparsers(dest="loadgen_action", metavar="{compare}")
    compare = actions.add_parser(
        "compare", help="two run directories side by side: table with ratios, overlaid latency CDFs",
        description="Read two `cascade loadgen --out` directories and write compare.md, compare.json and "
        "compare_cdfs.png to --out: correct goodput (with its 95%% bootstrap interval), goodput, SLO attainment, "
        "accuracy, throughput and latency percentiles of A and B, and B's ratio to A.")
    compare.add_argument("run_a", help="run directory A (the baseline)")
    compare.add_argument("run_b", help="run directory B")
    compare.add_argument("--out", default="compare", help="folder for the comparison (default ./compare)")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout")
    compare.set_defaults(func=compare_command)
    return p


def compare_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from loadgen.compare import CompareError, run_compare

    try:
        table = run_compare(Path(args.run_a), Path(args.run_b), Path(args.out))
    except CompareError as exc:
        return _error(str(exc))
    except OSError as exc:
        return _error(f"cannot write {args.out}: {exc.strerror or exc}")
    if args.json:
        sys.stdout.write(json.dumps(table) + "\n")
    else:
        sys.stdout.write((Path(args.out) / "compare.md").read_text())
    return 0


def _error(message: str) -> int:
    print(f"cascade: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_command(args: argparse.Namespace) -> int:
    import msgspec

    from loadgen.metrics import parse_slo
    from loadgen.run import LoadConfig, LoadgenError, parse_quality_mix, run_load

    missing = [f"--{name}" for name in ("url", "dataset", "out") if getattr(args, name) is None]
    if missing:
        return _error(f"the following arguments are required: {', '.join(missing)}")
    try:
        arrival = args.arrival
        if args.burstiness != 1.0 and arrival == "poisson":
            arrival = "gamma"
        for name in ("n", "concurrency"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise LoadgenError(f"--{name} must be at least 1, got {value}")
        if args.rate is not None and not args.rate > 0:
            raise LoadgenError(f"--rate must be > 0, got {args.rate}")
        cfg = LoadConfig(
            url=args.url, dataset=args.dataset, rate=args.rate, arrival=arrival, burstiness=args.burstiness,
            trace=args.trace, n=args.n, duration_s=args.duration_s, concurrency=args.concurrency,
            slo=parse_slo(args.slo), quality_mix=parse_quality_mix(args.quality_mix), seed=args.seed,
            model=args.model, max_tokens=args.max_tokens, temperature=args.temperature, stream=not args.no_stream,
            timeout_s=args.timeout_s, drain_s=args.drain_s, attainment_level=args.attainment_level,
            normalize=not args.no_normalize, api_key=args.api_key, data_dir=args.data_dir,
            event_loop=args.event_loop, progress=False if args.no_progress else None, out=args.out,
        )
        from loadgen.client import Client

        Client(cfg.url)  # validate the URL before any work
        if args.sweep:
            from pathlib import Path

            from loadgen.report import write_run
            from loadgen.sweep import parse_rates, run_sweep

            sweep, summary, records = run_sweep(cfg, parse_rates(args.sweep), args.attainment_target,
                                                args.sweep_refine)
            write_run(Path(cfg.out or "."), records, summary, sweep)
            summary = {**summary, "sweep": sweep}
        else:
            summary, _ = run_load(cfg)
    except (LoadgenError, ValueError) as exc:
        return _error(str(exc))
    except OSError as exc:
        return _error(f"cannot write the run directory {args.out}: {exc.strerror or exc}")
    if args.json:
        ordered = {k: summary[k] for k in CONTRACT_KEYS} | summary
        sys.stdout.write(msgspec.json.encode(ordered).decode() + "\n")
    else:
        print(_one_line(summary, args.out))
    return 0


def _one_line(summary: dict[str, Any], out: str) -> str:
    ttft, e2el = summary["ttft_ms"], summary["e2el_ms"]
    acc = "" if summary["accuracy"] is None else f", accuracy {100 * summary['accuracy']:.1f}%"
    if summary.get("truncated"):  # a cut answer is graded wrong: say so, or the accuracy misleads
        acc += f" ({summary['truncated']} cut by the length limit: raise --max-tokens)"
    best = ""
    if "sweep" in summary:
        best = f", max sustainable rate {summary['sweep']['max_sustainable_rate_rps']} rps"
    return (f"{summary['completed']}/{summary['requests']} completed ({summary['failed']} failed) at "
            f"{summary['achieved_rate_rps']:.2f} rps; TTFT p50 {ttft['p50']} ms, p99 {ttft['p99']} ms; "
            f"E2EL p50 {e2el['p50']} ms; goodput {summary['goodput_rps']:.3f} rps, SLO attainment "
            f"{100 * summary['slo_attainment']:.1f}%{acc}{best}. Report: {out}/report.md")
