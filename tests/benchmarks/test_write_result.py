"""cascade.testing.scripts.write_result: a benchmark's --json-out is written after the work is done, so a missing
folder is made, and a path that cannot be written is one line and exit 2, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.testing.scripts import write_result


def test_missing_folders_are_made_and_the_file_ends_in_one_newline(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "r.json"
    write_result(out, '{"x": 1}\n')
    assert out.read_text() == '{"x": 1}\n'


def test_an_unwritable_path_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exited:
        write_result(blocker / "r.json", "{}")  # a file where a folder should be
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write --json-out" in err
