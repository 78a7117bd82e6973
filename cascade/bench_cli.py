"""`cascade bench branches` (cascade/bench.py has the method). Only argparse at import time."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from cascade.errors import ConfigError


def add_bench_commands(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks of serving features on real tiers").add_subparsers(
        dest="bench_command", required=True, metavar="WHAT")
    br = bench.add_parser(
        "branches", help="vanilla vs self-consistency vs SART (+ ablations) on GSM8K under Poisson arrivals",
        description="Replay the same GSM8K questions and Poisson arrivals against one tier with each method: "
        "vanilla (1 greedy branch), self_consistency (N to completion, majority vote), sart (N, early stop at M, "
        "two-phase pruning), early_stop_only, prune_only. With no --config, starts the embedded CPU ladder and "
        "uses its reasoning tier. Prints accuracy, mean/p95 latency (from arrival, queueing included) and "
        "decode tokens per method.",
    )
    br.add_argument("--config", help="cascade.toml (default: the embedded CPU ladder)")
    br.add_argument("--tier", help="tier to run on (default: the last tier)")
    br.add_argument("--dataset", default="gsm8k", help="gsm8k (test split, default), gsm8k-train, or a .jsonl file")
    br.add_argument("--n-questions", type=int, default=20, help="seeded sample of questions (default 20)")
    br.add_argument("--rate", type=float, default=0.05, help="Poisson arrival rate, requests/s (default 0.05)")
    br.add_argument("--n", type=int, default=4, help="branches N (default 4)")
    br.add_argument("--m", type=int, default=2, help="branches that must finish, M (default 2)")
    br.add_argument("--alpha", type=float, default=0.3, help="phase-1 prune threshold (default 0.3)")
    br.add_argument("--beta", type=int, default=1, help="phase-1 prunes per request at most (default 1)")
    br.add_argument("--k", type=int, default=2, help="score every K reasoning steps (default 2)")
    br.add_argument("--max-tokens", type=int, default=512, help="per branch (default 512)")
    br.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of branches (default 0.7)")
    br.add_argument("--slots", type=int, default=0, help="branch slots on the tier (default 4 x N)")
    br.add_argument("--methods", default=",".join(("vanilla", "self_consistency", "sart", "early_stop_only",
                                                   "prune_only")), help="comma-separated subset, run in this order")
    br.add_argument("--sweep", help="also run sart and self_consistency for each N:M in this list, e.g. 2:1,4:2,8:4")
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--out", help="directory for summary.json, per-request records and the sweep PNG")
    br.add_argument("--save-branches", help="JSONL of every finished self-consistency branch with its correctness "
                    "(local analysis only: never commit it)")
    br.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    br.set_defaults(func=_branches)


def _branches(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    import msgspec
    from tqdm import tqdm

    from cascade.bench import METHODS, BenchSettings, arrival_offsets, run_key, run_method, summarize
    from cascade.config import load_config
    from cascade.engines.embedded import embedded_config
    from cascade.engines.supervisor import Supervisor
    from cascade.label import select_prompts
    from cascade.tiers import build_tiers, make_workers

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ConfigError(f"--methods takes names from {', '.join(METHODS)}, got {args.methods!r}")
    sweep = _parse_sweep(args.sweep)
    settings = BenchSettings(n=args.n, m=args.m, alpha=args.alpha, beta=args.beta, k=args.k, rate=args.rate,
                             max_tokens=args.max_tokens, temperature=args.temperature, slots=args.slots,
                             seed=args.seed)
    if not 1 <= args.m <= args.n:
        raise ConfigError(f"--n/--m: need 1 <= M <= N, got N={args.n} M={args.m}")
    if args.rate <= 0 or args.n_questions < 1:
        raise ConfigError("--rate must be > 0 and --n-questions >= 1")
    config = load_config(args.config) if args.config else embedded_config()
    names = [t.name for t in config.tiers]
    tier_name = args.tier or names[-1]
    if tier_name not in names:
        raise ConfigError(f"--tier {tier_name!r} is not in the config (tiers: {', '.join(names)})")
    prompts = select_prompts(args.dataset, args.n_questions, args.seed)
    offsets = arrival_offsets(len(prompts), args.rate, args.seed)
    runs = [(m, settings) for m in methods]
    runs += [(m, msgspec.structs.replace(settings, n=n, m=k)) for n, k in sweep for m in ("self_consistency", "sart")]

    # Opened before the models start, so a bad path fails at once; each request's branches are written and
    # flushed when it completes, so a run stopped half-way keeps what it finished.
    saved: TextIO | None = None
    if args.save_branches:
        try:
            saved = open(args.save_branches, "w")  # noqa: SIM115 - closed in run()'s finally, after the last request
        except OSError as exc:
            raise ConfigError(f"--save-branches: cannot write {args.save_branches}: {exc.strerror}") from None

    def save_branches(rows: list[dict]) -> None:
        assert saved is not None
        saved.writelines(json.dumps(row) + "\n" for row in rows)
        saved.flush()

    async def run() -> dict[str, Any]:
        # Only the worker(s) the tier runs on: the bench asks nothing of the others.
        workers = make_workers(config, Path.cwd() / "logs", [tier_name])
        supervisor = Supervisor(list(workers.values()))
        tiers = build_tiers(config, workers, [tier_name])
        tier = tiers[0]
        results: dict[str, Any] = {}
        sweep_results: list[dict] = []
        done: dict[bytes, dict[str, Any]] = {}  # run_key -> summary: a sweep repeats no finished run
        await supervisor.start()
        try:
            unique = len({run_key(m, s) for m, s in runs})
            with tqdm(total=unique * len(prompts), desc="bench branches", unit="request") as bar:
                for i, (method, s) in enumerate(runs):
                    key = run_key(method, s)
                    if key in done:
                        summary = done[key]
                    else:
                        bar.set_postfix_str(f"{method} N={s.n} M={s.m}")
                        records = await run_method(tier, method, s, prompts, offsets, lambda _: bar.update(1),
                                                   save_branches if saved is not None else None)
                        summary = done[key] = summarize(records)
                        if args.out:
                            out = Path(args.out)
                            out.mkdir(parents=True, exist_ok=True)
                            with (out / "requests.jsonl").open("ab") as f:
                                for r in records:
                                    f.write(msgspec.json.encode({"method": method, "n": s.n, "m": s.m,
                                                                 **msgspec.to_builtins(r)}) + b"\n")
                    if i < len(methods):
                        results[method] = summary
                    else:
                        sweep_results.append({"method": method, "n": s.n, "m": s.m, **summary})
        finally:
            for t in tiers:
                await t.backend.aclose()
                if t.scorer is not None:
                    await t.scorer.aclose()
            supervisor.stop()
            if saved is not None:
                saved.close()
        return {"methods": results, "sweep": sweep_results}

    outcome = asyncio.run(run())
    payload = {
        **outcome,
        "config": {"tier": tier_name, "dataset": args.dataset, "n_questions": len(prompts), "rate_rps": args.rate,
                   "n": args.n, "m": args.m, "alpha": args.alpha, "beta": args.beta, "k": args.k,
                   "max_tokens": args.max_tokens, "temperature": args.temperature,
                   "slots": args.slots or 4 * args.n, "seed": args.seed},
        "questions": [p.id for p in prompts],
    }
    if args.out:
        out = Path(args.out)
        (out / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
        if outcome["sweep"]:
            payload["plot"] = str(_plot_sweep(out / "sweep.png", outcome["sweep"], outcome["methods"], args.n, args.m))
    if args.json:
        print(json.dumps(payload))
    else:
        for name, s in outcome["methods"].items():
            print(f"{name:18s} accuracy {s['accuracy']:.3f}  latency mean {s['latency_s_mean']:.1f} s  "
                  f"p95 {s['latency_s_p95']:.1f} s  tokens {s['tokens_mean']:.0f}", file=sys.stdout)
    return 0


def _parse_sweep(raw: str | None) -> list[tuple[int, int]]:
    if not raw:
        return []
    pairs = []
    for item in raw.split(","):
        try:
            n, m = (int(x) for x in item.split(":"))
        except ValueError:
            raise ConfigError(f"--sweep takes N:M pairs like 2:1,4:2, got {item!r}") from None
        if not 1 <= m <= n:
            raise ConfigError(f"--sweep: need 1 <= M <= N, got {item!r}")
        pairs.append((n, m))
    return pairs


def _plot_sweep(path: Any, sweep: list[dict], methods: dict[str, dict], n: int, m: int) -> Any:
    """Accuracy vs mean latency: SART per N:M and self-consistency per N (it ignores M), the main run's
    settings included, and the other methods of the main run as single markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main_points = [{"method": k, "n": n, "m": m, **v} for k, v in methods.items() if k in ("sart", "self_consistency")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, marker in (("self_consistency", "s"), ("sart", "o")):
        keyed = {(p["n"], p["m"] if method == "sart" else 0): p for p in [*main_points, *sweep]
                 if p["method"] == method}
        points = [keyed[k] for k in sorted(keyed)]
        ax.plot([p["latency_s_mean"] for p in points], [p["accuracy"] for p in points], marker=marker, label=method)
        for p in points:
            label = f"{p['n']}:{p['m']}" if method == "sart" else f"N={p['n']}"
            ax.annotate(label, (p["latency_s_mean"], p["accuracy"]), fontsize=8)
    for method, marker in (("vanilla", "x"), ("early_stop_only", "^"), ("prune_only", "v")):
        if method in methods:
            v = methods[method]
            ax.scatter([v["latency_s_mean"]], [v["accuracy"]], marker=marker, label=f"{method} ({n}:{m})")
    ax.set_xlabel("mean end-to-end latency (s)")
    ax.set_ylabel("accuracy")
    ax.set_title("Branches: accuracy vs latency (SART labelled N:M)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
