"""`cascade profile`: argparse wiring only (the profiler, cascade/profiler/fit.py, loads when it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from cascade.errors import ConfigError

if TYPE_CHECKING:
    from cascade.optimizer.profile import Profile
    from cascade.profiler.fit import Settings


def add_profile_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure a live backend's prefill and decode-step times for `cascade optimize plan`",
        description="Stream chat requests to an OpenAI-compatible server: TTFT over a sweep of prompt lengths "
        "(concurrency 1) and inter-token latency at concurrency 1, 2, 4, ... Fits prefill = fixed + per-token "
        "and decode step = fixed + per-sequence x batch (+ per-context-token), and writes a profile JSON that "
        "a problem.toml tier names with `profile = \"FILE\"`. With --from-loadgen, fits the same model from a "
        "finished `cascade loadgen --out RUN` instead (no server needed): the engine as it steps under staggered "
        "arrivals, which a batch probe can miss (on the embedded CPU workers by 20-30%).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", help="base URL of the server to measure, e.g. http://127.0.0.1:30000")
    source.add_argument("--from-loadgen", metavar="RUN",
                        help="fit from this loadgen run folder (or its requests.jsonl): decode step from the "
                        "inter-token gaps against the batch in flight, prefill from TTFTs of lone prefills")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--model", default="", help="model to request (default: the first id of GET /v1/models); with "
                   "--from-loadgen, the model the profile names (default: the one the run's responses named)")
    p.add_argument("--prompt-tokens", default="64,256,1024", help="prompt-length sweep (comma-separated)")
    p.add_argument("--repeats", type=int, default=3, help="requests per prompt length (median TTFT)")
    p.add_argument("--max-batch", type=int, default=8, help="largest concurrency of the decode sweep")
    p.add_argument("--output-tokens", type=int, default=32, help="max_tokens of every request")
    p.add_argument("--decode-prompt-tokens", type=int, default=64, help="prompt length of the decode sweep")
    p.add_argument("--time-limit-s", type=float, default=300.0, help="bound on the whole measurement")
    p.add_argument("--kv-capacity-tokens", type=int,
                   help="the engine's KV cache in tokens (default: SGLang's /server_info, or /get_server_info "
                   "on older versions, else unknown)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of the measured replica")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree of the measured replica")
    p.add_argument("--label", default="", help="free text kept in the profile (engine, version, hardware)")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (SGLang, vLLM) for full-length outputs")
    p.add_argument("--api-key", default="", help="sent as `Authorization: Bearer KEY`")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts' words")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=_profile_command)


def settings_from_args(args: argparse.Namespace) -> Settings:
    from cascade.profiler.fit import Settings

    try:
        sweep = tuple(sorted({int(x) for x in args.prompt_tokens.split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--prompt-tokens: expected comma-separated integers, got {args.prompt_tokens!r}") from None
    if len(sweep) < 2 or sweep[0] < 1:
        raise ConfigError("--prompt-tokens: give at least two distinct positive lengths, e.g. 64,256,1024")
    _check_positive(args, "repeats", "max_batch", "output_tokens", "decode_prompt_tokens", "tp", "pp")
    if args.output_tokens < 2:
        raise ConfigError("--output-tokens must be at least 2 (inter-token latency needs two tokens)")
    if not args.time_limit_s > 0:
        raise ConfigError(f"--time-limit-s must be > 0, got {args.time_limit_s}")
    return Settings(url=args.url.rstrip("/"), model=args.model, prompt_tokens=sweep, repeats=args.repeats,
                    max_batch=args.max_batch, output_tokens=args.output_tokens,
                    decode_prompt_tokens=args.decode_prompt_tokens, time_limit_s=args.time_limit_s,
                    api_key=args.api_key, ignore_eos=args.ignore_eos, kv_capacity_tokens=args.kv_capacity_tokens,
                    tp=args.tp, pp=args.pp, label=args.label, seed=args.seed)


def _check_positive(args: argparse.Namespace, *names: str) -> None:
    """These options and --kv-capacity-tokens (when given) must be at least 1."""
    for name in names:
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.kv_capacity_tokens is not None and args.kv_capacity_tokens < 1:
        raise ConfigError(f"--kv-capacity-tokens must be at least 1, got {args.kv_capacity_tokens}")


def _profile_command(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.optimizer.profile import write_profile

    if args.from_loadgen:
        from cascade.profiler.fit import profile_from_loadgen

        _check_positive(args, "tp", "pp")
        profile = profile_from_loadgen(args.from_loadgen, model=args.model, label=args.label,
                                       kv_capacity_tokens=args.kv_capacity_tokens, tp=args.tp, pp=args.pp)
    else:
        profile = _measure(args)
    write_profile(args.out, profile)
    summary = {"profile": args.out, "source": profile.source, "model": profile.model,
               "prefill": msgspec.to_builtins(profile.prefill), "decode": msgspec.to_builtins(profile.decode),
               "prompt_tokens_source": profile.prompt_tokens_source,
               "prefill_points": len(profile.prefill_points), "decode_points": len(profile.decode_points),
               "kv_capacity_tokens": profile.kv_capacity_tokens, "elapsed_s": profile.elapsed_s}
    if args.json:
        print(json.dumps(summary))
    else:
        p, d = profile.prefill, profile.decode
        print(f"wrote {args.out}: prefill {1000 * p.fixed_s:.1f} ms + {1e6 * p.per_token_s:.1f} us/token; decode step "
              f"{1000 * d.fixed_s:.1f} ms + {1000 * d.per_sequence_s:.2f} ms/sequence "
              f"+ {1e6 * d.per_context_token_s:.3f} us/context token "
              f"({'a load test of ' if profile.source == 'loadgen' else ''}{profile.elapsed_s:.0f} s)")
    return 0


def _measure(args: argparse.Namespace) -> Profile:
    import asyncio

    from tqdm import tqdm

    from cascade.profiler.fit import measure

    settings = settings_from_args(args)
    total = 1 + len(settings.prompt_tokens) * settings.repeats + len(settings.batches())
    with tqdm(total=total, desc="profile", unit="run", file=sys.stderr,
              disable=True if args.no_progress else None) as bar:
        return asyncio.run(measure(settings, lambda: bar.update(1)))
