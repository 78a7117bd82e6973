"""`cascade loadgen compare`: two run directories (as `cascade loadgen --out` writes them) side by side."""

from __future__ import annotations

import json

from cascade.cli import main
from cascade.data.records import RequestRecord
from loadgen.metrics import summarize
from loadgen.report import write_run


def write_fake_run(folder, right: int, slow: int, slo: dict[str, float]) -> None:
    """100 graded requests over 10 s: `right` correct and fast, `slow` correct but late, the rest wrong."""
    records = []
    for i in range(100):
        late = right <= i < right + slow
        records.append(RequestRecord(index=i, prompt_id=f"p{i}", ttft_ms=50.0, e2el_ms=5000.0 if late else 800.0,
                                     output_tokens=10, reference="1", correct=i < right + slow, sent_s=i / 10))
    write_run(folder, records, summarize(records, slo, duration_s=10.0), plots=False)


def test_compare_puts_correct_goodput_first_with_ratios_and_writes_its_files(tmp_path, capsys) -> None:
    slo = {"e2el_ms": 2000.0}
    write_fake_run(tmp_path / "static", right=30, slow=20, slo=slo)
    write_fake_run(tmp_path / "reactive", right=45, slow=0, slo=slo)
    out = tmp_path / "cmp"
    assert main(["loadgen", "compare", str(tmp_path / "static"), str(tmp_path / "reactive"), "--out", str(out),
                 "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    rows = {r["metric"]: r for r in table["rows"]}
    assert table["rows"][0]["metric"] == "correct goodput rps"
    assert (rows["correct goodput rps"]["a"], rows["correct goodput rps"]["b"]) == (3.0, 4.5)
    assert rows["correct goodput rps"]["b_over_a"] == 1.5
    assert rows["accuracy"]["b_over_a"] == 0.9  # 45 right against 50: B is less accurate, but more of it is on time
    assert table["same_slo"] and table["a_ci95"][0] < 3.0 < table["a_ci95"][1]
    assert (out / "compare.md").read_text().startswith("# static vs reactive")
    assert "| correct goodput rps | 3.000 (" in (out / "compare.md").read_text()
    assert (out / "compare_cdfs.png").stat().st_size > 0 and (out / "compare.json").is_file()


def test_compare_says_when_the_runs_had_different_slos(tmp_path, capsys) -> None:
    write_fake_run(tmp_path / "a", right=30, slow=20, slo={"e2el_ms": 2000.0})
    write_fake_run(tmp_path / "b", right=30, slow=20, slo={"e2el_ms": 9000.0})
    assert main(["loadgen", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    assert "Different SLOs" in capsys.readouterr().out


def test_a_folder_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    write_fake_run(tmp_path / "a", right=30, slow=0, slo={})
    (tmp_path / "empty").mkdir()
    assert main(["loadgen", "compare", str(tmp_path / "a"), str(tmp_path / "empty"), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cascade: error:") and "not a loadgen run directory" in err and "\n" not in err
