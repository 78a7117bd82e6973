"""What an emulated engine answers (cascade/testing/fakes/gpu.py): the seam between how long a GPU takes and what the
model says. An `AnswerSource` plans each request's generated tokens; the emulator only times them.

`LengthAnswers` is the plain one: numbered tokens, a fixed number of them or as many as the request's max_tokens
allows. `RecordedAnswers` (cascade/testing/fakes/recorded.py) replays a tier's recorded answers and output tokens
per question and branch.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from cascade.testing.fakes.script import FakeScript, token_pieces
from cascade.testing.fakes.sglang_shapes import Step


class Answer(msgspec.Struct, frozen=True):
    """The generated tokens, as the fake SGLang plans them: one (kind, text) step per token, kind "content" or
    "reasoning_content" (sglang_shapes.py); `finish` "stop" (it ended on its own) or "length" (max_tokens cut it)."""

    steps: list[Step]
    finish: Literal["stop", "length"] = "stop"


class AnswerSource(Protocol):
    def answer(self, body: dict[str, Any]) -> Answer:
        """The answer to one chat request body (its `messages`, `max_tokens`, `seed`, ...)."""
        ...


def max_new_tokens(body: dict[str, Any], unset: int) -> int:
    """The request's output limit (`max_completion_tokens`, else `max_tokens`), `unset` when it names none."""
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or unset)


class LengthAnswers:
    """`tokens` numbered tokens per answer (cut at the request's max_tokens), or, with `tokens` None, exactly as many as
    the request allows (a request without max_tokens gets `unset_max_tokens`, SGLang's default max_new_tokens)."""

    def __init__(self, tokens: int | None = None, unset_max_tokens: int = 128) -> None:
        if tokens is not None and tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {tokens}")
        self.tokens = tokens
        self.unset_max_tokens = unset_max_tokens

    def answer(self, body: dict[str, Any]) -> Answer:
        limit = max_new_tokens(body, self.unset_max_tokens)
        if self.tokens is None:
            return Answer(_numbered(limit), "length")
        return Answer(_numbered(min(self.tokens, limit)), "length" if self.tokens > limit else "stop")


def _numbered(n: int) -> list[Step]:
    return [("content", piece) for piece in token_pieces(FakeScript(tokens=n), n)]
