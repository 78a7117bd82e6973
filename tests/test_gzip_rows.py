"""Long runs append gzipped JSONL as they go (benchmarks/reasoning/branch_logprobs.py) and are killed at a session's end: the
member a killed run leaves has no end, and the next run appends a new member after it. `json_rows` reads every
complete line of both; the standard reader stopped at the cut (EOFError) or failed on what followed it
(zlib.error: "invalid block type"), which lost every row the resumed run wrote (cascade/bench/runs.py)."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cascade.bench.runs import json_rows
from cascade.errors import ConfigError


def member(rows: range, cut: float | None = None) -> bytes:
    """One gzip member holding `rows` as a writer that flushes each line leaves it; `cut`: the share of its bytes a
    kill left (no end-of-stream marker)."""
    compressor = zlib.compressobj(wbits=31)
    data = b"".join(compressor.compress(json.dumps({"row": i}).encode() + b"\n") + compressor.flush(zlib.Z_SYNC_FLUSH)
                    for i in rows)
    if cut is None:
        return data + compressor.flush()
    return data[:int(len(data) * cut)]


def read(path: Path) -> list[int]:
    return [r["row"] for r in json_rows(path)]


def test_a_member_cut_by_a_kill_then_a_resumed_runs_member_gives_the_rows_of_both(tmp_path: Path) -> None:
    path = tmp_path / "scores.jsonl.gz"
    path.write_bytes(member(range(0, 300), cut=0.7) + member(range(300, 400)))
    with pytest.raises(zlib.error), gzip.open(path, "rt") as f:  # what the standard reader does with this file
        f.read()
    rows = read(path)
    assert rows[-100:] == list(range(300, 400))  # the resumed run's rows, all of them
    kept = rows[:-100]
    assert kept == list(range(len(kept))) and len(kept) > 150  # the cut member's rows up to near the cut, in order


def test_two_cut_members_and_a_complete_one(tmp_path: Path) -> None:
    path = tmp_path / "scores.jsonl.gz"
    path.write_bytes(member(range(0, 50), cut=0.5) + member(range(50, 100), cut=0.9) + member(range(100, 110)))
    rows = read(path)
    assert rows == sorted(rows) and rows[-10:] == list(range(100, 110))
    assert any(r < 50 for r in rows) and any(50 <= r < 100 for r in rows)


def test_a_file_that_is_not_gzip_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl.gz"
    path.write_text('{"row": 1}\n')
    with pytest.raises(ConfigError, match="not gzip"):
        list(json_rows(path))
    assert list(json_rows(tmp_path / "missing.jsonl.gz")) == []
    (tmp_path / "empty.jsonl.gz").write_bytes(b"")
    assert list(json_rows(tmp_path / "empty.jsonl.gz")) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 120), st.one_of(st.none(), st.floats(0.0, 1.0))), min_size=1, max_size=6))
def test_any_sequence_of_cut_and_complete_members_reads_in_order_and_loses_no_complete_member(
        tmp_path_factory: pytest.TempPathFactory, members: list[tuple[int, float | None]]) -> None:
    """Members of 0-120 rows, each complete or cut anywhere: the rows read come in write order, none twice, none
    invented, and every complete member's rows are all there."""
    path = tmp_path_factory.mktemp("rows") / "scores.jsonl.gz"
    data, first, complete = b"", 0, list[int]()
    for size, cut in members:
        data += member(range(first, first + size), cut)
        if cut is None:
            complete.extend(range(first, first + size))
        first += size
    path.write_bytes(data)
    if data and not data.startswith(b"\x1f\x8b\x08"):  # the first member cut to less than its header
        with pytest.raises(ConfigError):
            read(path)
        return
    rows = read(path)
    assert rows == sorted(set(rows)) and set(rows) <= set(range(first))
    assert set(complete) <= set(rows)
