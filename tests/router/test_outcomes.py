"""Outcomes load the same from RouteLLM CSVs, folders of CSVs and `cascade label` JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cascade.errors import ConfigError
from cascade.router.outcomes import load_outcomes, parse_tiers, split_indices
from tests.shared_data import shared_file

ROWS = [("What is 2+2?", True, True), ("Prove that 17 is prime, then add 3.", False, True), ("Name a color.", True, False)]


def _write_csv(path, rows=ROWS) -> None:
    lines = ["prompt,weak,strong,weak_response"] + [f'"{p}",{w},{s},"..."' for p, w, s in rows]
    path.write_text("\n".join(lines) + "\n")


def test_csv_and_jsonl_outcomes_load_to_the_same_matrix(tmp_path) -> None:
    _write_csv(tmp_path / "data.csv")
    with (tmp_path / "data.jsonl").open("w") as f:
        for i, (p, w, s) in enumerate(ROWS):
            tiers = {"weak": {"correct": w, "output_tokens": 12, "latency_s": 0.5}, "strong": {"correct": s}}
            f.write(json.dumps({"id": f"toy:{i}", "prompt": p, "tiers": tiers}) + "\n")
    from_csv = load_outcomes(tmp_path / "data.csv", ["weak", "strong"])
    from_jsonl = load_outcomes(tmp_path / "data.jsonl", ["weak", "strong"])
    assert from_csv.prompts == from_jsonl.prompts == [r[0] for r in ROWS]
    assert np.array_equal(from_csv.correct, from_jsonl.correct)
    assert from_csv.correct.tolist() == [[True, True], [False, True], [True, False]]
    assert from_jsonl.ids[1] == "toy:1" and from_jsonl.groups == ["toy"] * 3
    assert len(from_csv.sha256) == 64


def test_jsonl_keeps_what_each_answer_cost_and_a_csv_says_unknown(tmp_path) -> None:
    rows = [{"weak": {"correct": True, "output_tokens": 12, "latency_s": 0.5},
             "strong": {"correct": False, "output_tokens": 30, "decode_tokens": 95, "latency_s": 2.0}},
            {"weak": {"correct": False, "output_tokens": 7}, "strong": {"correct": True}}]
    (tmp_path / "o.jsonl").write_text("".join(json.dumps({"id": f"t:{i}", "prompt": f"q{i}", "tiers": tiers}) + "\n"
                                              for i, tiers in enumerate(rows)))
    outcomes = load_outcomes(tmp_path / "o.jsonl", ["weak", "strong"])
    assert outcomes.tokens is not None and outcomes.latency is not None
    # A branched tier's cost is every branch's tokens (decode_tokens), not the one answer's.
    assert np.array_equal(outcomes.tokens, [[12, 95], [7, np.nan]], equal_nan=True)
    assert np.array_equal(outcomes.latency, [[0.5, 2.0], [np.nan, np.nan]], equal_nan=True)
    second = outcomes.subset(np.array([1]))
    assert second.tokens is not None and second.tokens.tolist()[0][0] == 7
    _write_csv(tmp_path / "data.csv")
    from_csv = load_outcomes(tmp_path / "data.csv", ["weak", "strong"])
    assert from_csv.tokens is not None and np.isnan(from_csv.tokens).all() and from_csv.tokens.shape == (3, 2)


def test_a_folder_of_csvs_is_one_table_grouped_by_file(tmp_path) -> None:
    _write_csv(tmp_path / "mmlu_a.csv")
    _write_csv(tmp_path / "mmlu_b.csv", ROWS[:2])
    outcomes = load_outcomes(tmp_path, ["weak", "strong"])
    assert len(outcomes) == 5
    assert outcomes.groups == ["mmlu_a"] * 3 + ["mmlu_b"] * 2


def test_missing_tier_column_names_the_columns(tmp_path) -> None:
    _write_csv(tmp_path / "data.csv")
    with pytest.raises(ConfigError, match=r"missing column.*medium.*columns are: prompt, weak, strong"):
        load_outcomes(tmp_path / "data.csv", ["weak", "medium"])


def test_non_boolean_cell_is_reported_with_its_line(tmp_path) -> None:
    (tmp_path / "bad.csv").write_text('prompt,weak,strong\n"a",True,maybe\n')
    with pytest.raises(ConfigError, match=r"bad.csv:2: column strong must be a boolean"):
        load_outcomes(tmp_path / "bad.csv", ["weak", "strong"])


def test_jsonl_row_without_a_tier_is_reported(tmp_path) -> None:
    (tmp_path / "o.jsonl").write_text(json.dumps({"id": "x:1", "prompt": "p", "tiers": {"weak": {"correct": True}}}))
    with pytest.raises(ConfigError, match=r"o.jsonl:1: no outcome for tier.*strong"):
        load_outcomes(tmp_path / "o.jsonl", ["weak", "strong"])


def test_tiers_need_two_distinct_names() -> None:
    assert parse_tiers("a, b,c") == ["a", "b", "c"]
    for bad in ("a", "a,a", ""):
        with pytest.raises(ConfigError):
            parse_tiers(bad)


def test_split_is_a_seeded_permutation_with_floor_train_rows() -> None:
    train, test = split_indices(1319, 0.5, 0)
    assert len(train) == 659 and len(test) == 660
    assert set(train).isdisjoint(test) and len(set(train) | set(test)) == 1319
    assert np.array_equal(split_indices(1319, 0.5, 0)[1], test)
    assert set(test) == set(np.random.RandomState(0).permutation(1319)[659:])


def test_label_rows_without_text_get_their_prompts_from_the_dataset() -> None:
    shared_file("gsm8k", "train.jsonl")  # the outcomes rows carry ids only; their prompts are read from it
    tiers = ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-reason"]
    outcomes = load_outcomes(Path(__file__).parents[2] / "models/outcomes/gsm8k-train-embedded.jsonl", tiers)
    assert len(outcomes.prompts) >= 17 and all(p.strip() for p in outcomes.prompts)
    assert outcomes.correct.shape == (len(outcomes.prompts), 3)
