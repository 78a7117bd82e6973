"""`usage.completion_tokens_details.reasoning_tokens` (cascade/service/reasoning.py): the engine's count where it
gives one, else the tier's tokenizer (embedded workers) within its limits, else the chunks that carried reasoning;
never above the completion tokens."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from cascade.config import decode_config
from cascade.engines.models import cache_root
from cascade.engines.prompt_count import TemplateCounter
from cascade.schemas import REASONING_FIELDS
from cascade.service.keys.counting import TEXT_MAX_BYTES, TEXT_QUEUE_BYTES, PromptCounter
from cascade.service.reasoning import ReasoningShown
from cascade.testing.servers import ladder_toml
from cascade.tiers.build import Tier, build_tiers

QWEN = cache_root() / "qwen2.5-coder-0.5b"
TEXT = "First, 17 * 20 = 340; then 17 * 3 = 51; so 391."
COUNTER = PromptCounter()
SHOWN = ReasoningShown(REASONING_FIELDS, COUNTER)


def tier(*model_dirs: Path) -> Tier:
    built = build_tiers(decode_config(ladder_toml("http://127.0.0.1:9")), {})[0]  # never called
    return msgspec.structs.replace(built, model_dirs=model_dirs)


def tokens(t: Tier, text: str, reported: int | None, chunks: int, completion: int = 1000) -> int:
    return asyncio.run(SHOWN.tokens(t, text, reported, chunks, completion))


@pytest.mark.parametrize(("text", "reported", "chunks", "completion", "expected"), [
    (TEXT, 12, 30, 100, 12),  # the engine's count
    ("", 7, 0, 100, 7),  # reasoning the engine counted but did not return as text (shown inline, say)
    (TEXT, 0, 9, 100, 9),  # 0 beside reasoning text: an engine that does not count them
    (TEXT, None, 9, 100, 9),  # no count, no tokenizer: the chunks
    ("", None, 4, 100, 4),  # a stream whose text was not kept
    (TEXT, 500, 9, 40, 40),  # never above the completion tokens
    (TEXT, -3, 9, 100, 9),  # a negative count is none
    ("", None, 0, 100, 0),  # no reasoning
])
def test_the_count_is_the_engines_else_the_chunks(text: str, reported: int | None, chunks: int, completion: int,
                                                  expected: int) -> None:
    assert tokens(tier(), text, reported, chunks, completion) == expected


@pytest.mark.skipif(not (QWEN / "tokenizer.json").is_file(), reason="the embedded models are not prepared "
                                                                    "(`cascade models prepare`)")
def test_an_embedded_tier_counts_with_its_tokenizer_within_its_limits() -> None:
    qwen = tier(QWEN)
    assert COUNTER.wait_loaded([qwen], timeout_s=60)
    expected = TemplateCounter.load(QWEN).tokens(TEXT)
    assert expected != 9 and tokens(qwen, TEXT, None, 9) == expected
    assert tokens(qwen, TEXT, 0, 9) == expected  # 0 beside text: counted
    # TEXT_MAX_BYTES (256 KiB): up to it counted, past it the chunks.
    at = ("1 " * (TEXT_MAX_BYTES // 2))[:TEXT_MAX_BYTES]
    assert tokens(qwen, at, None, 5, completion=1 << 30) > 5
    assert tokens(qwen, at + "x", None, 5, completion=1 << 30) == 5
    assert tokens(qwen, "é" * (TEXT_MAX_BYTES // 2 + 1), None, 5, completion=1 << 30) == 5  # bytes, not characters
    # TEXT_QUEUE_BYTES (1 MiB) already counting or waiting: the chunks, until they are done.
    assert TEXT_QUEUE_BYTES == 1 << 20
    COUNTER.text_pending_bytes = TEXT_QUEUE_BYTES - len(TEXT) + 1
    try:
        assert tokens(qwen, TEXT, None, 9) == 9
    finally:
        COUNTER.text_pending_bytes = 0
    assert tokens(qwen, TEXT, None, 9) == expected
