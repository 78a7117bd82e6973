"""A prompt counted as an embedded worker counts it (cascade/engines/prompt_count.py), checked against transformers'
own functions, the ones `transformers serve` calls for a chat request (the messages prepared by
`BaseHandler.get_processor_inputs_from_messages`, then the tokenizer's `apply_chat_template` with the generation
prompt), on hostile messages, for the embedded models this machine has prepared (one per tokenizer file: Qwen2.5's
0.5B and 1.5B share theirs, and their templates differ only where tools are rendered)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.engines.models import all_cards, is_prepared, model_dir
from cascade.engines.prompt_count import TemplateCounter
from cascade.schemas import ChatMessage, FunctionCall, ToolCall
from tests.hostile_messages import MESSAGES

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="the `embedded` extra is not installed (`make install-test` installs it)")
PREPARED = [model_dir(card) for card in all_cards() if is_prepared(card)]
MODELS = list({hashlib.sha256((d / "tokenizer.json").read_bytes()).digest(): d for d in reversed(PREPARED)}.values())
pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(not MODELS, reason="no embedded model is prepared (`cascade models prepare`)")]
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def engines() -> dict[Path, tuple[TemplateCounter, Any]]:
    """Per prepared model: cascade's counter, and the tokenizer as the worker loads it."""
    shared: dict[str, Any] = {}
    return {d: (TemplateCounter.load(d, shared), transformers.AutoTokenizer.from_pretrained(d)) for d in MODELS}


def engine_count(tokenizer: Any, messages: list[ChatMessage]) -> int:
    """What the worker reports as `prompt_tokens` for `messages` sent as cascade sends them (JSON)."""
    from transformers.cli.serving.utils import BaseHandler, Modality

    body = msgspec.json.decode(msgspec.json.encode(messages))
    inputs = BaseHandler.get_processor_inputs_from_messages(body, Modality.LLM)
    return len(tokenizer.apply_chat_template(inputs, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])


@PROPERTY
@given(messages=MESSAGES, which=st.integers(0, 8))
def test_a_prompt_is_counted_exactly_as_the_worker_counts_it(engines: dict[Path, tuple[TemplateCounter, Any]],
                                                               messages: list[ChatMessage], which: int) -> None:
    counter, tokenizer = engines[MODELS[which % len(MODELS)]]
    counted = counter.count(messages)
    try:
        expected = engine_count(tokenizer, messages)
    except Exception:  # the template refuses these messages (the worker answers an error): not counted
        assert counted is None
        return
    assert counted == expected


def test_models_sharing_a_tokenizer_file_load_it_once() -> None:
    shared: dict[str, Any] = {}
    counters = [TemplateCounter.load(d, shared) for d in PREPARED]
    assert len(shared) == len({c.tokenizer_id for c in counters})
    assert len({id(c.tokenizer) for c in counters}) == len(shared)


def test_an_assistant_turn_that_called_tools_is_not_counted() -> None:
    counter = TemplateCounter.load(MODELS[0])
    call = ToolCall(id="c", function=FunctionCall(name="f", arguments='{"x": 1}'))
    assert counter.count([ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", tool_calls=[call])]) \
        is None


@pytest.mark.parametrize("files", [{}, {"tokenizer.json": "not json", "chat_template.jinja": "{{ messages }}"},
                                   {"tokenizer.json": "{}"}, {"chat_template.jinja": "{{ messages }}"}])
def test_a_model_directory_without_a_readable_tokenizer_or_template_fails_to_load(tmp_path: Path,
                                                                                   files: dict[str, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises((OSError, ValueError)):
        TemplateCounter.load(tmp_path)


def test_a_template_that_reads_special_tokens_gets_them_from_the_tokenizer_config(tmp_path: Path) -> None:
    """As transformers passes a tokenizer's special tokens to its template (Llama's templates open with
    `bos_token`), whether tokenizer_config.json writes one as text or as an added token's object."""
    source = MODELS[-1]
    shutil.copy(source / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    bos = config["eos_token"]
    config.update(bos_token={"__type": "AddedToken", "content": bos, "special": True}, eos_token=bos)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}")
    messages = [ChatMessage(role="user", content="How many apples?")]
    counted = TemplateCounter.load(tmp_path).count(messages)
    assert counted == engine_count(transformers.AutoTokenizer.from_pretrained(tmp_path), messages)
    assert counted == TemplateCounter.load(source).tokens(f"{bos}user: How many apples?{bos}")


def test_the_counter_normalizes_and_splits_text_as_the_worker_tokenizer_does(
        engines: dict[Path, tuple[TemplateCounter, Any]]) -> None:
    # transformers 5 rebuilds some tokenizers' pipelines in their class (Qwen2's adds NFC): the counter must match.
    for counter, tokenizer in engines.values():
        worker = tokenizer.backend_tokenizer
        assert str(counter.tokenizer.normalizer) == str(worker.normalizer)
        assert str(counter.tokenizer.pre_tokenizer) == str(worker.pre_tokenizer)
        decomposed = [ChatMessage(role="system", content="e\u0301")]
        assert counter.count(decomposed) == engine_count(tokenizer, decomposed)
