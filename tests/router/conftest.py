"""Shared fixtures: seeded synthetic outcomes whose difficulty grows with prompt length and number count, and
seeded synthetic GSM8K-format solutions whose number of steps grows with the question's clauses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.shared_data import shared_file

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
    return shared_file("routellm", "gsm8k_responses.csv")


def synthetic_solutions(n: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """GSM8K-format rows: a question of k clauses (k = 1..6) and a reference solution of k steps."""
    rng = np.random.default_rng(seed)
    names = ["Sam", "Ann", "Raj", "Mia", "Leo", "Ivy"]
    rows = []
    for _ in range(n):
        k = int(rng.integers(1, 7))
        values = [int(v) for v in rng.integers(2, 50, size=k)]
        clauses = [f"{names[i % len(names)]} then buys {v} more apples" for i, v in enumerate(values)]
        question = "A box holds 1 apple. " + ". ".join(clauses) + ". How many apples are there in the end?"
        total, steps = 1, []
        for v in values:
            steps.append(f"{total}+{v}=<<{total}+{v}={total + v}>>{total + v}")
            total += v
        rows.append({"question": question, "answer": "\n".join(steps) + f"\n#### {total}"})
    return rows


@pytest.fixture
def steps_jsonl(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in synthetic_solutions()))
    return path


@pytest.fixture
def gsm8k_train_jsonl():
    return shared_file("gsm8k", "train.jsonl")
