"""Shared fixtures: seeded synthetic outcomes whose difficulty grows with prompt length and number count."""

from __future__ import annotations

import numpy as np
import pytest

from cascade.router.outcomes import shared_data_dir

GSM8K_TIERS = ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]


def synthetic_outcomes(n: int = 240, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Prompts of 1..6 clauses; the weak tier fails more often on long, number-heavy prompts."""
    rng = np.random.default_rng(seed)
    prompts, correct = [], []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        clauses = [f"Sam buys {int(rng.integers(2, 99))} apples for ${int(rng.integers(1, 9))} each" for _ in range(k)]
        prompts.append(". ".join(clauses) + ". How much does he pay in total?")
        p_weak, p_strong = 0.95 - 0.13 * k, 0.97 - 0.03 * k
        correct.append([rng.random() < p_weak, rng.random() < p_strong])
    return prompts, np.array(correct, dtype=bool)


@pytest.fixture
def synthetic() -> tuple[list[str], np.ndarray]:
    return synthetic_outcomes()


@pytest.fixture
def gsm8k_csv():
    path = shared_data_dir() / "routellm" / "gsm8k_responses.csv"
    if not path.exists():
        pytest.skip(f"shared data not found at {path} (set CASCADE_SHARED_DATA)")
    return path
