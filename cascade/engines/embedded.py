"""The embedded default: the config `cascade serve` uses when no --config is given.

Four CPU workers (SmolLM2-135M, Qwen2.5-Coder-0.5B, and Qwen2.5-Coder-1.5B twice: one greedy, one
sampling) and a ladder of four tiers: each of the three models answering directly; the 1.5B model
reasoning in several sampled branches on its sampling worker, pruned and voted (FACTS.md: SmolLM2 is a
chat tier, Qwen2.5-Coder-0.5B already shows a real difficulty gradient on arithmetic).
"""

from __future__ import annotations

from pathlib import Path

from cascade.config import CascadeConfig, load_config

EMBEDDED_TOML = Path(__file__).with_name("embedded.toml")


def embedded_config() -> CascadeConfig:
    return load_config(EMBEDDED_TOML)
