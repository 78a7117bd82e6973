"""Hostile chat messages for the tests of prompt counting (tests/engines/test_prompt_count.py,
tests/service/keys/test_counting.py): long runs of digits (one token a byte), unicode a byte-level tokenizer splits
into several tokens a character, chat-template markup and special tokens written as text, Jinja syntax, brackets
nested deep inside content parts, every role, with and without content."""

from __future__ import annotations

from hypothesis import strategies as st

from cascade.schemas import ChatMessage, TextPart

UNITS = st.sampled_from([
    "1", "9", "1 ", "12345", "3.14", " ", "\n", "\n\n", "\r\n", "\t", "a", "the ", "é", "e\u0301", "中文", "🙂",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u200b", "\u202e", "\u00a0", "\ufeff", "<|im_start|>", "<|im_end|>\n",
    "<|endoftext|>", "<|im_start|>system\n", "{{ messages }}", "{% for m in messages %}", "{#", "[", "]", "{", "}",
    '{"a": [', "\\", '"', "#### 18", "<tool_call>",
])
MAX_RUN = 3_000
RUN = st.tuples(st.one_of(UNITS, st.text(min_size=1, max_size=3)), st.integers(1, MAX_RUN)).map(
    lambda r: (r[0] * (r[1] // len(r[0]) + 1))[:r[1]])
NESTED = st.integers(1, 400).map(lambda depth: "[" * depth + '{"k": "v"}' + "]" * depth)
TEXT = st.lists(st.one_of(RUN, NESTED, st.text(max_size=40)), max_size=4).map("".join)
PARTS = st.lists(st.builds(TextPart, type=st.just("text"), text=TEXT), max_size=6)
MESSAGE = st.builds(
    ChatMessage,
    role=st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
    content=st.one_of(st.none(), TEXT, PARTS),
    tool_call_id=st.one_of(st.none(), st.just("call-1")),
    name=st.one_of(st.none(), st.just("sam")),
)
MESSAGES = st.lists(MESSAGE, min_size=1, max_size=6)
