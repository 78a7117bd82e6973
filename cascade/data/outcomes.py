"""Outcomes: one row per prompt with each tier's result, the one schema `cascade label` writes and the
router, the optimizer and the labeller read back.

JSONL, one object per line, keyed by dataset name and row id so committed files carry no dataset text:

    {"id": "gsm8k-train:17", "dataset": "gsm8k-train",
     "tiers": {"<tier>": {"correct": true, "answer": "18", "output_tokens": 211, "latency_s": 4.2,
                          "finish_reason": "stop", "decode_tokens": 640}}}

Every field but `tiers` may be missing: `cascade label` writes `correct`, `answer`, `output_tokens`,
`latency_s` and `finish_reason` (plus `decode_tokens` for a tier with reasoning branches, `prompt` with
`--with-text`, `token_confidence` with `--logprobs`); a tier's `branches` (each run to completion) feed the
planner's widths; planner-style rows carry a judge `score` in [0, 1],
`input_tokens`, and the router's `difficulty` or per-tier `p_fail`. Fields at their default are not
written, so a row is written exactly as `cascade label` always wrote it. Views over the rows (the
router's correctness matrix, the planner's numpy columns) live with their readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec

from cascade.data.datasets import DatasetError


class TokenConfidence(msgspec.Struct, frozen=True, kw_only=True):
    """An answer's confidence read from its token logprobs (cascade/branches/confidence.py computes it), each
    statistic exp(mean logprob) over: every token (`mean`), the weakest window of `group` tokens
    (`lowest_group`), the last `group` tokens (`tail`)."""

    tokens: int
    group: int
    mean: float
    lowest_group: float
    tail: float

    def read(self, statistic: str) -> float:
        """One statistic by name (`mean`, `lowest_group`, `tail`)."""
        value: float = getattr(self, statistic)
        return value


class BranchOutcome(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One reasoning branch of a tier, run to completion (what `cascade optimize` reads a width's quality
    from): its extracted answer (no text), whether it is right, its length, and a judge score if any."""

    answer: str | None = None
    correct: bool
    output_tokens: int
    score: float | None = None


class TierOutcome(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One tier's answer to one prompt."""

    correct: bool | None = None
    # UNSET, not None, by default: a graded answer the grader could not read is written as `null`.
    answer: str | msgspec.UnsetType | None = msgspec.UNSET
    score: float | None = None  # a judge score in [0, 1]
    output_tokens: int | None = None
    latency_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None  # the tier did not answer (such rows are not written by `cascade label`)
    decode_tokens: int | None = None  # a tier with reasoning branches: the tokens all branches generated
    token_confidence: TokenConfidence | None = None  # `cascade label --logprobs`, where the engine returns them
    # Independent branches run to completion, in sampling order (benchmarks/reasoning/branch_outcomes.py converts them
    # from `cascade bench branches --save-branches`): the planner's widths (cascade/optimizer/widths.py).
    branches: list[BranchOutcome] | None = None

    @property
    def tokens_spent(self) -> int | None:
        """What the answer cost in generated tokens: all branches' when known, else the answer's own."""
        return self.decode_tokens if self.decode_tokens is not None else self.output_tokens


class OutcomeRow(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One prompt's outcomes on every tier; `tiers` maps tier names to their results."""

    id: str | None = None  # the dataset row id, e.g. `gsm8k-train:17`
    dataset: str | None = None  # the dataset that holds the prompt text of `id`
    tiers: dict[str, TierOutcome]
    prompt: str | None = None  # the prompt text itself, for local use only
    input_tokens: int | None = None
    difficulty: float | None = None  # the router's p_fail of the cheapest tier
    p_fail: dict[str, float] = msgspec.field(default_factory=dict)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(OutcomeRow)


def write_row(sink: IO[bytes], row: OutcomeRow) -> None:
    """The writer: one row as one JSON line, flushed so that an interrupted run keeps every row it wrote."""
    sink.write(_ENCODER.encode(row) + b"\n")
    sink.flush()


def decode_rows(raw: bytes, source: str | Path) -> Iterator[tuple[int, OutcomeRow]]:
    """The reader: each row of an outcomes file's bytes with its line number (from 1); blank lines are
    skipped. A line that is not an outcome row raises DatasetError naming `source` and the line."""
    for line_no, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield line_no, _DECODER.decode(line)
        except msgspec.ValidationError as exc:
            raise DatasetError(f"{source}:{line_no}: not an outcome row: {exc}") from None
        except msgspec.DecodeError as exc:
            raise DatasetError(f"{source}:{line_no}: not valid JSON ({exc})") from None


def read_rows(path: str | Path) -> list[tuple[int, OutcomeRow]]:
    """Every row of an outcomes file with its line number (see `decode_rows`)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read outcomes {path}: {exc.strerror}") from None
    return list(decode_rows(raw, path))
