"""`cascade bench branches` (cascade/bench/methods.py has the method). Only argparse at import time."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from cascade.errors import ConfigError

if TYPE_CHECKING:
    from cascade.config.tiers import TierConfig

METHOD_HELP = (
    "vanilla: one branch decoded greedily (on a tier whose embedded worker samples, it runs on the config's tier "
    "of the same model with a greedy worker, or is refused); self_consistency: N sampled branches run to completion, "
    "majority vote; sart: N branches, stop once M finish, two-phase pruning by the tier's scorer; early_stop_only: "
    "N branches, stop once M finish, no pruning; prune_only: N branches, pruning, no early stop; adaptive: "
    "self-consistency with a first wave (--first-wave branches first; the other N only when they disagree). The "
    "branched ones are refused on a tier whose worker decodes greedily, as the gateway refuses them there."
)


def add_bench_commands(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks of serving features on real tiers").add_subparsers(
        dest="bench_command", required=True, metavar="WHAT")
    br = bench.add_parser(
        "branches", help="vanilla vs self-consistency vs SART (+ ablations) on GSM8K under Poisson arrivals",
        description="Replay the same GSM8K questions and Poisson arrivals against one tier with each method. "
        f"{METHOD_HELP} With no --config, starts the embedded CPU ladder and uses its reasoning tier (vanilla on "
        "its direct tier of the same model). Prints accuracy, mean/p95 latency (from arrival, queueing included) "
        "and decode tokens per method; the JSON's config.methods says which tier each method ran on and the "
        "temperature/top_p it decoded at. With --out, a rerun of the same command resumes: requests already "
        "finished there are not run again (they keep the latency measured when they ran; the rest keep their "
        "planned arrival gaps), and the summary counts them as `resumed`; --fresh starts over.",
    )
    br.add_argument("--config", help="cascade.toml (default: the embedded CPU ladder)")
    br.add_argument("--tier", help="tier to run on (default: the last tier)")
    br.add_argument("--dataset", default="gsm8k", help="gsm8k (test split, default), gsm8k-train, or a .jsonl file")
    br.add_argument("--n-questions", type=int, default=20, help="seeded sample of questions (default 20)")
    br.add_argument("--rate", type=float, default=0.05, help="Poisson arrival rate, requests/s (default 0.05)")
    # The branch settings default to the tier's own (what it serves), so `--methods sart` alone measures it.
    # Each flag is the [tiers.branches] setting of the same name (cascade/config/branches.py).
    br.add_argument("--n", type=int, help="branches N (default: the tier's `branches.n`, or 4 on an unbranched tier)")
    br.add_argument("--m", type=int, help="branches that must finish, M (default: the tier's `branches.m`, or 2)")
    br.add_argument("--alpha", type=float, help="phase-1 prune threshold (default: the tier's `branches.alpha`, or "
                    "0.3)")
    br.add_argument("--beta", type=int, help="phase-1 prunes per request at most (default: the tier's "
                    "`branches.beta`, or 1)")
    br.add_argument("--k", type=int, help="score every K reasoning steps (default: the tier's `branches.k`, or 2)")
    br.add_argument("--first-wave", type=int, help="adaptive's first wave: branches launched first, the rest only "
                    "when they disagree (default: the tier's `branches.first_wave`, or 2)")
    br.add_argument("--wave-margin", type=int, help="adaptive's waves: 0 launches the rest at once when the first "
                    "wave disagrees; D > 0 doubles the waves (W, 2W, ... N) and stops once the leading answer is D "
                    "votes ahead (default: the tier's `branches.wave_margin`, or 0)")
    br.add_argument("--max-tokens", type=int, default=512, help="per branch (default 512)")
    br.add_argument("--temperature", type=float, help="sampling temperature of the branched methods (vanilla is "
                    "greedy). On a tier of embedded workers it is the worker's `temperature`, which its engine "
                    "applies to every request: a different value is refused. Elsewhere default: the tier's "
                    "`branches.temperature`")
    br.add_argument("--top-p", type=float, help="top_p of the branched methods: on a tier of embedded workers the "
                    "worker's (a different value is refused), elsewhere default 1.0")
    br.add_argument("--slots", type=int, default=0, help="branch slots on the tier (default: the tier's "
                    "`branches.slots`, else 4 x N)")
    br.add_argument("--methods", default=",".join(("vanilla", "self_consistency", "sart", "early_stop_only",
                                                   "prune_only")), help="comma-separated subset, run in this order "
                    "(adaptive runs only when named)")
    br.add_argument("--sweep", help="also run sart and self_consistency for each N:M in this list, e.g. 2:1,4:2,8:4")
    br.add_argument("--seed", type=int, default=0, help="seed of the question sample, the arrivals and (unless "
                    "--sampling-seed) the branches' sampling")
    br.add_argument("--sampling-seed", type=int, help="seed of the branches' sampling alone: the same questions at "
                    "the same arrivals, sampled again (a run of its own in --out)")
    br.add_argument("--out", help="directory for summary.json, per-request records (requests.jsonl, appended as "
                    "each request finishes: a rerun of the same command resumes from it, and one with a larger "
                    "--n-questions runs only the questions it adds) and the sweep PNG")
    br.add_argument("--fresh", action="store_true", help="ignore the records a previous run left in --out (and "
                    "start --save-branches over)")
    br.add_argument("--save-branches", help="JSONL of every finished self-consistency or adaptive branch with its "
                    "correctness and method "
                    "(appended to when resuming; local analysis only: never commit it)")
    br.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    br.set_defaults(func=_branches)


def _branch_defaults(args: argparse.Namespace, tier: TierConfig) -> None:
    """Fill the branch settings not given from `tier`'s own when it is branched (else the former fixed defaults)."""
    served = tier.branches.n > 1
    for name, fixed in (("n", 4), ("m", 2), ("alpha", 0.3), ("beta", 1), ("k", 2), ("first_wave", 2),
                        ("wave_margin", 0)):
        own = getattr(tier.branches, name)
        if getattr(args, name) is None:  # a tier without a first wave still gives adaptive one of 2
            setattr(args, name, own if served and (own or name != "first_wave") else fixed)
    if not args.slots and served:
        args.slots = tier.branches.slots


def _branches(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    import msgspec

    from cascade.bench.methods import METHODS, BenchSettings, arrival_offsets, check_settings, decoding
    from cascade.bench.runs import BenchRun, run_benchmark
    from cascade.bench.targets import bench_targets
    from cascade.config import load_config
    from cascade.engines.embedded import embedded_config
    from cascade.label import select_prompts
    from cascade.repo_paths import recorded_value
    from cascade.tiers.build import make_workers

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ConfigError(f"--methods takes names from {', '.join(METHODS)}, got {args.methods!r}")
    sweep = _parse_sweep(args.sweep)
    if args.rate <= 0 or args.n_questions < 1:
        raise ConfigError("--rate must be > 0 and --n-questions >= 1")
    config = load_config(args.config) if args.config else embedded_config()
    names = [t.name for t in config.tiers]
    tier_name = args.tier or names[-1]
    if tier_name not in names:
        raise ConfigError(f"--tier {tier_name!r} is not in the config (tiers: {', '.join(names)})")
    _branch_defaults(args, config.tiers[names.index(tier_name)])
    settings = BenchSettings(n=args.n, m=args.m, alpha=args.alpha, beta=args.beta, k=args.k, rate=args.rate,
                             max_tokens=args.max_tokens, slots=args.slots, seed=args.seed,
                             sampling_seed=args.sampling_seed,
                             first_wave=args.first_wave, wave_margin=args.wave_margin)
    for method in dict.fromkeys(["sart", *methods]):  # sart's settings hold every flag but adaptive's waves
        check_settings(method, settings)
    for n, k in sweep:
        try:
            check_settings("sart", msgspec.structs.replace(settings, n=n, m=k))
        except ConfigError as exc:
            raise ConfigError(f"--sweep {n}:{k}: {exc.message}") from None
    branched = bool(sweep) or any(m != "vanilla" for m in methods)
    targets = bench_targets(config, tier_name, vanilla="vanilla" in methods, branched=branched,
                            temperature=args.temperature, top_p=args.top_p)
    settings = msgspec.structs.replace(settings, temperature=targets.temperature, top_p=targets.top_p)
    prompts = select_prompts(args.dataset, args.n_questions, args.seed)
    offsets = arrival_offsets(len(prompts), args.rate, args.seed)
    runs = [BenchRun(method=m, settings=settings, tier=targets.vanilla_tier if m == "vanilla" else targets.tier)
            for m in methods]
    runs += [BenchRun(method=m, settings=msgspec.structs.replace(settings, n=n, m=k), tier=targets.tier, main=False)
             for n, k in sweep for m in ("self_consistency", "sart")]
    out = Path(args.out) if args.out else None
    outcome = asyncio.run(run_benchmark(
        config, runs, prompts, offsets, dataset=args.dataset,
        # Only the workers the methods' tiers run on: the bench asks nothing of the others.
        workers_for=lambda tiers: make_workers(config, Path.cwd() / "logs", tiers),
        out=out, fresh=args.fresh, save_branches=Path(args.save_branches) if args.save_branches else None))
    per_method = {r.method: dict(zip(("temperature", "top_p"), decoding(r.method, settings), strict=True))
                  | ({"first_wave": settings.first_wave, "wave_margin": settings.wave_margin}
                     if r.method == "adaptive" else {})
                  for r in runs if r.main}
    payload = {
        **outcome,
        "config": {"tier": tier_name, "dataset": recorded_value(args.dataset),  # a file: repo-relative
                   "n_questions": len(prompts), "rate_rps": args.rate,
                   "n": args.n, "m": args.m, "alpha": args.alpha, "beta": args.beta, "k": args.k,
                   "max_tokens": args.max_tokens,
                   # The branched methods' sampling (None when none ran); each method's own in `methods`.
                   "temperature": targets.temperature if branched else None,
                   "top_p": targets.top_p if branched else None,
                   "methods": {r.method: {"tier": r.tier, **per_method[r.method]} for r in runs if r.main},
                   "slots": args.slots or 4 * args.n, "seed": args.seed, "sampling_seed": args.sampling_seed},
        "questions": [p.id for p in prompts],
    }
    if out is not None:
        (out / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
        if outcome["sweep"]:
            payload["plot"] = str(_plot_sweep(out / "sweep.png", outcome["sweep"], outcome["methods"], args.n, args.m))
    if args.json:
        print(json.dumps(payload))
    else:
        for name, s in outcome["methods"].items():
            print(f"{name:18s} accuracy {s['accuracy']:.3f}  latency mean {s['latency_s_mean']:.1f} s  "
                  f"p95 {s['latency_s_p95']:.1f} s  tokens {s['tokens_mean']:.0f}", file=sys.stdout)
        if "vanilla" in methods and targets.vanilla_tier != tier_name:
            print(f"vanilla ran on tier {targets.vanilla_tier} (greedy worker, the same model): tier {tier_name}'s "
                  "worker samples every request")
        if outcome["resumed"]:
            print(f"resumed: {outcome['resumed']} requests from a previous run (in {args.out}; they keep the latency "
                  "measured when they ran)")
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
        pairs.append((n, m))  # checked with the other settings (check_settings)
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
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
