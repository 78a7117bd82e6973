"""What one request produced: the per-request row of `requests.jsonl`, and the prompts sent.

`cascade loadgen` writes `requests.jsonl`; the profiler and benchmarks read it back, so its row is
a data record here rather than load-generator internals.
"""

from __future__ import annotations

from pathlib import Path

import msgspec


class Prompt(msgspec.Struct, kw_only=True, frozen=True):
    """One dataset item: the text sent as the user message, and what to grade the answer against."""

    id: str
    prompt: str
    reference: str | None = None
    max_tokens: int | None = None  # per-item output length (ShareGPT reply length, trace response tokens)


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request's measurements. Times are milliseconds; `*_s` are offsets from the run start.

    `error` is set when the request failed (HTTP status, in-band error, connection fault, timeout);
    a failed request never meets the SLO and never counts as correct.
    """

    index: int
    prompt_id: str
    quality: str | None = None
    scheduled_s: float = 0.0
    sent_s: float | None = None
    dispatch_lag_ms: float | None = None
    status: int | None = None
    error: str | None = None
    ttft_ms: float | None = None
    e2el_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = msgspec.field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    model: str | None = None
    tier: str | None = None
    tier_index: int | None = None
    reference: str | None = None
    extracted: str | None = None
    correct: bool | None = None
    meets_slo: bool | None = None
    output: str = ""
    # What the gateway said the request cost (cascade's `cascade.cost`: its total, in `cost_currency` units); None
    # when the response carried no cost.
    cost: float | None = None
    cost_currency: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class RecordsError(ValueError):
    """A requests file that cannot be read or holds something else (one line, for the CLI)."""


def read_request_records(run: str | Path) -> list[RequestRecord]:
    """The rows of a finished `cascade loadgen --out RUN` (its requests.jsonl; RUN may also name that file)."""
    path = Path(run)
    path = path / "requests.jsonl" if path.is_dir() else path
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise RecordsError(f"cannot read {path}: {exc.strerror or exc}") from None
    decoder = msgspec.json.Decoder(RequestRecord)
    records = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(decoder.decode(line))
            except msgspec.MsgspecError as exc:
                raise RecordsError(f"{path}:{number}: not a cascade loadgen requests file: {exc}") from None
    return records
