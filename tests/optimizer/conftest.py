"""A small planning problem shared by the planner and CLI tests (fast settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

SMALL_PROBLEM = """
[cluster]
gpu = "h100-sxm"
gpus = 8
gpus_per_node = 8

[[tiers]]
name = "small"
model = "llama-3.1-8b"

[[tiers]]
name = "large"
model = "deepseek-r1-distill-qwen-32b"

[workload]
rate_rps = 4.0

[outcomes]
kind = "synthetic"
n = 300
seed = 3
skills = [0.55, 0.9]
output_medians = [300.0, 250.0]

[routing]
mode = "{mode}"

[quality]
target = 0.85
metric = "correct"
mu = 1000.0

[search]
seed = 0
pop_size = 12
generations = 4
front_generations = 3
max_rounds = 3
sim_requests = 200
"""


@pytest.fixture
def small_problem(tmp_path: Path) -> Path:
    path = tmp_path / "problem.toml"
    path.write_text(SMALL_PROBLEM.format(mode="route"))
    return path


@pytest.fixture
def small_cascade_problem(tmp_path: Path) -> Path:
    path = tmp_path / "cascade-problem.toml"
    path.write_text(SMALL_PROBLEM.format(mode="cascade").replace('metric = "correct"', 'metric = "score"'))
    return path
