"""The run directory's report: the sweep's accuracy-vs-goodput plot and the correct-goodput rows."""

from __future__ import annotations

from cascade.data.records import RequestRecord
from loadgen.metrics import summarize
from loadgen.report import write_run


def sweep_point(rate: float, goodput: float, correct: float, accuracy: float | None) -> dict:
    return {"rate_rps": rate, "achieved_rate_rps": float(rate), "slo_attainment": 0.9, "goodput_rps": goodput,
            "correct_goodput_rps": correct, "correct_goodput_ci95": [correct * 0.9, correct * 1.1],
            "min_slo_scale": 1.0, "accuracy": accuracy, "failed": 0, "ttft_p99_ms": 50.0, "e2el_p99_ms": 900.0}


def test_a_graded_sweep_gets_an_accuracy_vs_goodput_plot_and_its_table_shows_correct_goodput(tmp_path) -> None:
    records = [RequestRecord(index=i, prompt_id=f"p{i}", ttft_ms=50.0, e2el_ms=800.0, output_tokens=5,
                             reference="1", correct=i % 2 == 0) for i in range(10)]
    summary = summarize(records, {"e2el_ms": 2000.0}, duration_s=5.0)
    sweep = {"attainment_target": 0.9, "max_sustainable_rate_rps": 2.0, "first_failing_rate_rps": 4.0,
             "points": [sweep_point(1, 1.0, 0.5, 0.5), sweep_point(2, 2.0, 0.9, 0.45), sweep_point(4, 2.5, 0.8, 0.3)]}
    paths = write_run(tmp_path, records, summary, sweep)
    assert tmp_path / "accuracy_vs_goodput.png" in paths
    report = (tmp_path / "report.md").read_text()
    assert "| **correct goodput** (graded correct and within the SLO) | 1.000 (" in report
    assert "| 2 | 2.00 | 90.0% | 2.000 | 0.900 (0.810-0.990) |" in report
    page = (tmp_path / "report.html").read_text()
    # Self-contained: every plot the Markdown links is inside the page, and no file is referenced.
    assert page.count('src="data:image/png;base64,') == report.count("![") and ".png)" not in page
    assert "<td class=\"num\">0.900 (0.810-0.990)</td>" in page and "<strong>correct goodput</strong>" in page


def test_an_ungraded_sweep_has_no_accuracy_axis_to_plot(tmp_path) -> None:
    records = [RequestRecord(index=0, prompt_id="p0", ttft_ms=50.0, e2el_ms=800.0, output_tokens=5)]
    summary = summarize(records, {}, duration_s=1.0)
    sweep = {"attainment_target": 0.9, "max_sustainable_rate_rps": 1.0, "first_failing_rate_rps": None,
             "points": [sweep_point(1, 1.0, 0.0, None)]}
    paths = write_run(tmp_path, records, summary, sweep)
    assert not (tmp_path / "accuracy_vs_goodput.png").exists() and (tmp_path / "attainment_vs_rate.png") in paths
