"""The embedded default: the config `cascade serve` uses when no --config is given.

Two CPU workers (SmolLM2-135M and Qwen2.5-Coder-0.5B) and a ladder of three tiers:
the small model answering directly; the larger model answering directly; the larger model
reasoning in several sampled branches, pruned and voted (FACTS.md: the small model is a chat tier,
the larger one shows a real difficulty gradient on arithmetic).
"""

from __future__ import annotations

from pathlib import Path

from cascade.config import CascadeConfig, load_config

EMBEDDED_TOML = Path(__file__).with_name("embedded.toml")


def embedded_config() -> CascadeConfig:
    return load_config(EMBEDDED_TOML)
