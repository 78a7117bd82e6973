"""An answer's reasoning as its client gets it: the names its text goes under (`[gateway] reasoning_fields`: both
`reasoning_content` and `reasoning` by default, whichever the engine sent; cascade/service/frames.py and
responses.py write them), and its tokens (`usage.completion_tokens_details.reasoning_tokens`), per choice the first
of these that applies:

1. the engine's own count (its usage: SGLang's `reasoning_tokens`, or OpenAI's place for it), unless it reports 0
   beside reasoning text (an engine that does not count them);
2. the reasoning text counted with the tier's tokenizer, where its replicas are embedded workers and the tokenizer is
   loaded: the one prompts are counted with (cascade/service/keys/counting.py `text_tokens`), off the event loop;
3. the stream chunks that carried reasoning text: one decode step each, the rule cascade already counts completion
   tokens by for an engine that reports no usage.

Each is at most the choice's completion tokens. The bill reads none of this: it counts every token decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from cascade.branches.backend import GenerationResult, StreamDelta
from cascade.service.keys.counting import PromptCounter
from cascade.tiers.build import Tier

log = logging.getLogger("cascade.gateway")


@dataclass(frozen=True)
class ReasoningShown:
    """How one gateway shows answers' reasoning: under `names`, its tokens counted by `counter`'s tokenizers."""

    names: tuple[str, ...]
    counter: PromptCounter

    async def tokens(self, tier: Tier, text: str, reported: int | None, chunks: int, completion_tokens: int) -> int:
        """One choice's reasoning tokens (the module docstring's rule): `text` its reasoning ("" where it was not kept),
        `reported` the engine's count (None: none), `chunks` the stream chunks that carried reasoning."""
        reasoned = bool(text) or chunks > 0
        if reported is not None and (reported > 0 or not reasoned):
            return _at_most(reported, completion_tokens)
        if not reasoned:
            return 0
        counted = None
        if text and tier.model_dirs:
            try:
                counted = await self.counter.text_tokens(tier.model_dirs, text)
            except Exception:  # a tokenizer fault is never the client's: the chunks count it
                log.exception("counting the reasoning of tier %s failed: its chunks count it", tier.name)
        return _at_most(chunks if counted is None else counted, completion_tokens)

    async def of(self, tier: Tier, results: Sequence[GenerationResult]) -> int:
        """The reasoning tokens of an answer's choices, all together."""
        total = 0
        for r in results:
            total += await self.tokens(tier, r.reasoning, r.reasoning_tokens, r.reasoning_chunks, r.completion_tokens)
        return total


def _at_most(tokens: int, completion_tokens: int) -> int:
    return max(0, min(tokens, completion_tokens))


class ReasoningSeen:
    """One streamed choice's reasoning as it goes by: the engine's count, the chunks, and the text itself only where
    the tier's tokenizer may count it (`keep_text`)."""

    __slots__ = ("chunks", "keep_text", "parts", "reported")

    def __init__(self, keep_text: bool) -> None:
        self.keep_text = keep_text
        self.reported: int | None = None
        self.chunks = 0
        self.parts: list[str] = []

    def saw(self, delta: StreamDelta) -> None:
        if delta.reasoning_tokens is not None:
            self.reported = delta.reasoning_tokens
        self.chunks += delta.reasoning_chunks
        if self.keep_text and delta.reasoning:
            self.parts.append(delta.reasoning)

    @property
    def text(self) -> str:
        """The reasoning seen, where it was kept ("" otherwise)."""
        return "".join(self.parts)
