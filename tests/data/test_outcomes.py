"""The one outcomes schema: what `cascade label` writes reads back identically, planner rows too."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest

from cascade.data.datasets import DatasetError
from cascade.data.outcomes import OutcomeRow, TierOutcome, decode_rows, read_rows, write_row

REPO = Path(__file__).resolve().parents[2]

LABEL_LINE = (
    b'{"id":"gsm8k-train:17","dataset":"gsm8k-train","tiers":{'
    b'"small":{"correct":false,"answer":null,"output_tokens":177,"latency_s":9.5,"finish_reason":"length"},'
    b'"big":{"correct":true,"answer":"18","output_tokens":235,"latency_s":4.25,"finish_reason":"stop",'
    b'"decode_tokens":520}}}\n'
)


def written(*rows: OutcomeRow) -> bytes:
    sink = io.BytesIO()
    for row in rows:
        write_row(sink, row)
    return sink.getvalue()


def test_a_label_row_is_written_as_cascade_label_always_wrote_it() -> None:
    row = OutcomeRow(id="gsm8k-train:17", dataset="gsm8k-train", tiers={
        "small": TierOutcome(correct=False, answer=None, output_tokens=177, latency_s=9.5, finish_reason="length"),
        "big": TierOutcome(correct=True, answer="18", output_tokens=235, latency_s=4.25, finish_reason="stop",
                           decode_tokens=520),
    })
    assert written(row) == LABEL_LINE
    assert [r for _, r in decode_rows(LABEL_LINE, "o.jsonl")] == [row]


def test_an_answer_the_grader_could_not_read_stays_null_and_a_missing_one_stays_missing() -> None:
    (_, row), = decode_rows(LABEL_LINE, "o.jsonl")
    assert row.tiers["small"].answer is None and row.tiers["big"].answer == "18"
    planner = OutcomeRow(id="0", tiers={"t": TierOutcome(correct=True)})
    assert written(planner) == b'{"id":"0","tiers":{"t":{"correct":true}}}\n'


def test_a_planner_row_with_score_difficulty_and_p_fail_round_trips(tmp_path: Path) -> None:
    row = OutcomeRow(id="gsm8k-17", input_tokens=96, difficulty=0.31, p_fail={"r1-7b": 0.31, "r1-32b": 0.1},
                     tiers={"r1-7b": TierOutcome(correct=True, score=0.92, output_tokens=611),
                            "r1-32b": TierOutcome(score=0.5)})
    path = tmp_path / "o.jsonl"
    path.write_bytes(written(row))
    (line, back), = read_rows(path)
    assert line == 1 and back == row
    assert back.tiers["r1-32b"].correct is None and back.dataset is None and back.prompt is None


def test_rows_keep_their_file_line_numbers_across_blank_lines() -> None:
    raw = b"\n" + LABEL_LINE + b"   \n" + LABEL_LINE
    assert [line for line, _ in decode_rows(raw, "o.jsonl")] == [2, 4]


def test_the_tokens_an_answer_cost_are_all_branches_when_known() -> None:
    assert TierOutcome(output_tokens=235, decode_tokens=520).tokens_spent == 520
    assert TierOutcome(output_tokens=235).tokens_spent == 235
    assert TierOutcome(correct=True).tokens_spent is None


@pytest.mark.parametrize(("line", "reason"), [
    (b'{"id": "a", "tiers": {"t": {"correct": "yes"}}}', "not an outcome row"),
    (b'{"id": "a"}', "not an outcome row"),
    (b'{"id": "a", "tiers": ', "not valid JSON"),
])
def test_a_bad_line_is_refused_naming_the_file_and_the_line(tmp_path: Path, line: bytes, reason: str) -> None:
    path = tmp_path / "o.jsonl"
    path.write_bytes(LABEL_LINE + line + b"\n")
    with pytest.raises(DatasetError, match=rf"o\.jsonl:2: {reason}"):
        read_rows(path)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"cannot read outcomes .*nothing\.jsonl"):
        read_rows(tmp_path / "nothing.jsonl")


def test_committed_outcome_files_are_written_back_byte_for_byte() -> None:
    path = REPO / "models" / "outcomes" / "gsm8k-train-embedded-v6.jsonl"
    raw = path.read_bytes()
    rows = [row for _, row in read_rows(path)]
    assert len(rows) == len(raw.splitlines()) and written(*rows) == raw
    assert all(row.prompt is None for row in rows)  # keyed by dataset and id: no dataset text committed
    assert msgspec.json.decode(raw.splitlines()[0])["dataset"] == rows[0].dataset == "gsm8k-train"
