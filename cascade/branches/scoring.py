"""The Scorer protocol: a reward in [0, 1] for a partial (or finished) reasoning branch.

SART prunes branches by a process reward model's score of their partial reasoning. Two kinds sit
behind this one seam: a PRM served by SGLang (Qwen2.5-Math-PRM style, `cascade.branches.prm_client`)
and an embedded CPU scorer that needs no GPU (`cascade.branches.cpu_scorer`).

Steps are paragraphs: a branch's text split on blank lines ("\\n\\n"), the PRM convention. The runner
calls `score` every K new steps of a branch, never per token.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

STEP_SEPARATOR = "\n\n"


def split_steps(text: str) -> list[str]:
    """The non-empty reasoning steps of a (partial) branch, in order."""
    return [step.strip() for step in text.split(STEP_SEPARATOR) if step.strip()]


@runtime_checkable
class Scorer(Protocol):
    name: str

    async def score(self, question: str, steps: list[str]) -> float:
        """Reward in [0, 1] of the reasoning so far (higher is more likely to end correct)."""
        ...

    async def aclose(self) -> None: ...
