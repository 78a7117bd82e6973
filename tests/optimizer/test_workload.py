"""Workload lengths and rate from a trace or a dataset in problem.toml, with measured lengths first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cascade.errors import ConfigError
from cascade.optimizer.instance import load_instance
from cascade.optimizer.problem import load_problem
from tests.shared_data import shared_file

PROBLEM = """
[cluster]
gpu = "h100-sxm"
gpus = 8

[[tiers]]
name = "small"
model = "llama-3.1-8b"

[[tiers]]
name = "large"
model = "deepseek-r1-distill-qwen-32b"

[workload]
{workload}

[outcomes]
{outcomes}

[routing]
mode = "route"

[quality]
target = 0.85
metric = "correct"
"""
FILE_OUTCOMES = 'kind = "file"\npath = "outcomes.jsonl"'


def write_outcomes(folder: Path, n: int = 40, lengths: bool = False) -> None:
    with (folder / "outcomes.jsonl").open("w") as f:
        for i in range(n):
            tiers = {t: {"correct": bool((i + k) % 2)} | ({"output_tokens": 7} if lengths else {})
                     for k, t in enumerate(("small", "large"))}
            row = {"id": str(i), "difficulty": i / n, "tiers": tiers} | ({"input_tokens": 3} if lengths else {})
            f.write(json.dumps(row) + "\n")


def write_trace(path: Path, rows: int = 50) -> None:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [f"{100 + 2 * i},ChatGPT,{100 + i},{500 + i},{600 + 2 * i},Conversation log" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def instance(folder: Path, workload: str, outcomes: str = FILE_OUTCOMES):
    spec = folder / "problem.toml"
    spec.write_text(PROBLEM.format(workload=workload, outcomes=outcomes))
    return load_instance(*load_problem(spec))


def test_a_trace_gives_the_lengths_and_its_mean_rate(tmp_path) -> None:
    write_outcomes(tmp_path)
    write_trace(tmp_path / "burstgpt.csv")  # 50 requests over 98 s
    inst = instance(tmp_path, 'trace = "burstgpt.csv"')
    assert inst.rate_rps == pytest.approx(49 / 98)
    assert set(inst.input_tokens) <= set(range(100, 150))
    # One response length per request serves every tier, paired with its own request length.
    assert (inst.output_tokens[:, 0] == inst.output_tokens[:, 1]).all()
    assert (inst.output_tokens[:, 0] - inst.input_tokens == 400).all()
    assert instance(tmp_path, 'trace = "burstgpt.csv"\nrate_rps = 3.0').rate_rps == 3.0


def test_measured_lengths_in_the_outcomes_win_over_the_trace(tmp_path) -> None:
    write_outcomes(tmp_path, lengths=True)
    write_trace(tmp_path / "burstgpt.csv")
    inst = instance(tmp_path, 'trace = "burstgpt.csv"')
    assert (inst.input_tokens == 3).all() and (inst.output_tokens == 7).all()


def test_a_trace_replaces_the_modelled_lengths_of_synthetic_outcomes(tmp_path) -> None:
    write_trace(tmp_path / "burstgpt.csv")
    inst = instance(tmp_path, 'trace = "burstgpt.csv"', 'kind = "synthetic"\nn = 100')
    assert set(inst.input_tokens) <= set(range(100, 150)) and inst.output_tokens.min() >= 500


def test_a_dataset_gives_prompt_lengths_and_its_reply_lengths_where_it_has_them(tmp_path) -> None:
    write_outcomes(tmp_path)
    with (tmp_path / "prompts.jsonl").open("w") as f:
        f.write(json.dumps({"prompt": "x" * 400, "max_tokens": 250}) + "\n")  # 100 tokens (chars / 4)
        f.write(json.dumps({"prompt": "y" * 40}) + "\n")  # no reply length: drawn from output_tokens
    inst = instance(tmp_path, 'rate_rps = 2.0\ndataset = "prompts.jsonl"\noutput_tokens = { median = 900.0, sigma = 0.01 }')
    short = inst.input_tokens == 10
    assert set(inst.input_tokens) == {100, 10} and (inst.output_tokens[~short] == 250).all()
    assert np.all(np.abs(inst.output_tokens[short] - 900) < 50)


def test_outcome_rows_take_the_lengths_of_the_dataset_prompts_they_name(tmp_path) -> None:
    write_outcomes(tmp_path, n=3)  # ids "0", "1", "2"
    with (tmp_path / "prompts.jsonl").open("w") as f:
        for i in (2, 0, 1):
            f.write(json.dumps({"id": str(i), "prompt": "z" * 40 * (i + 1), "max_tokens": 100 * (i + 1)}) + "\n")
    inst = instance(tmp_path, 'rate_rps = 1.0\ndataset = "prompts.jsonl"')
    assert inst.input_tokens.tolist() == [10, 20, 30] and inst.output_tokens[:, 1].tolist() == [100, 200, 300]


def test_gsm8k_by_name_gives_gsm8k_prompt_lengths(tmp_path) -> None:
    shared_file("gsm8k", "test.jsonl")
    write_outcomes(tmp_path, n=200)
    inst = instance(tmp_path, 'rate_rps = 2.0\ndataset = "gsm8k"')
    assert 40 <= np.median(inst.input_tokens) <= 70  # GSM8K questions: ~55 tokens


@pytest.mark.parametrize(("workload", "message"), [
    ('trace = "missing.csv"', "`workload.trace`: cannot read trace"),
    ('rate_rps = 1.0\ndataset = "no-such-set"', "`workload.dataset`: unknown dataset"),
    ('rate_rps = 1.0\ndataset = "gsm8k"\ntrace = "t.csv"', "are exclusive"),
    ('input_tokens = { median = 100.0 }', "`workload.rate_rps` is missing"),
])
def test_workload_errors_name_the_key(tmp_path, workload: str, message: str) -> None:
    write_outcomes(tmp_path)
    with pytest.raises(ConfigError, match=message):
        instance(tmp_path, workload)
