"""What `cascade deploy` tells an operator beside the commands: the files it writes (absolute paths, so that a dry
run says exactly where) and the Hugging Face token a gated model needs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# Hugging Face organisations whose checkpoints ask for accepted terms (a token with access) before a download.
GATED_PREFIXES = ("meta-llama/", "mistralai/", "google/gemma")


def gated_models(models: Iterable[str]) -> list[str]:
    return sorted({m for m in models if m.lower().startswith(GATED_PREFIXES)})


def hf_token_line(models: Iterable[str]) -> str:
    """One line: which served models need HF_TOKEN, or where it goes when one does."""
    gated = gated_models(models)
    if gated:
        return (f"# {', '.join(gated)}: gated on Hugging Face; export HF_TOKEN=<a token whose account accepted the "
                "model's terms> on every node before the engines start (SGLang downloads the weights with it)")
    return "# a gated model (meta-llama/*, mistralai/*, google/gemma*) needs HF_TOKEN exported on every node"


def written_files(config_out: Path, log_dir: Path, engine_names: Iterable[str] | None = None) -> list[str]:
    """The paths a run without --dry-run writes, as comment lines (`engine_names` None: the pattern)."""
    lines = [f"# without --dry-run: the gateway config {config_out.resolve()}, written once every engine is healthy"]
    if engine_names is None:
        return [*lines, f"# and one log per engine server: {log_dir.resolve()}/<tier>-<replica>.log"]
    return [*lines, *(f"# engine log {(log_dir / f'{name}.log').resolve()}" for name in engine_names)]
