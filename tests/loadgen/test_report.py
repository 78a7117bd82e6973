"""The run directory's report: the sweep's accuracy-vs-goodput plot, the correct-goodput rows, TPOT n/a, the PNGs."""

from __future__ import annotations

import pytest

from cascade.data.records import RequestRecord
from loadgen.metrics import summarize
from loadgen.plot_data import MIN_BAR_FRACTION
from loadgen.plots import bars, draw_ecdf
from loadgen.report import markdown, write_run


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


def test_a_non_streamed_run_reports_tpot_as_n_a_not_zero(tmp_path) -> None:
    # As the client records a non-streamed answer: one body, so TTFT == E2EL and no TPOT or ITL.
    records = [RequestRecord(index=i, prompt_id=f"p{i}", ttft_ms=900.0, e2el_ms=900.0, output_tokens=40, tier="small")
               for i in range(4)]
    summary = {**summarize(records, {"e2el_ms": 2000.0, "tpot_ms": 50.0}, duration_s=2.0), "run": {"stream": False}}
    paths = write_run(tmp_path, records, summary)
    report = (tmp_path / "report.md").read_text()
    assert "| tpot_ms | n/a | n/a | n/a | n/a |" in report and "| itl_ms | n/a | n/a | n/a | n/a |" in report
    assert "| small | 4 | 0 | 900.0 / 900.0 | n/a | 900.0 / 900.0 |" in report
    assert "Not streamed (`--no-stream`)" in report
    assert tmp_path / "latency_cdf.png" in paths and (tmp_path / "latency_cdf.png").stat().st_size > 0


def test_a_streamed_run_says_nothing_about_streaming() -> None:
    records = [RequestRecord(index=0, prompt_id="p0", ttft_ms=50.0, e2el_ms=800.0, tpot_ms=10.0, output_tokens=76)]
    summary = {**summarize(records, {}, duration_s=1.0), "run": {"stream": True}}
    report = markdown(summary, [])
    assert "Not streamed" not in report and "| tpot_ms | 10.0 | 10.0 | 10.0 | 10.0 |" in report


def test_every_plot_is_written_when_the_reported_scale_is_far_past_the_slo(tmp_path) -> None:
    # E2E latencies 7x the SLO: the smallest scale met is 7, outside the old fixed 0.1-5 axis.
    records = [RequestRecord(index=i, prompt_id=f"p{i}", ttft_ms=50.0, e2el_ms=7000.0 + i, tpot_ms=1.0,
                             output_tokens=5, tier="small" if i % 2 else "big", itl_ms=[1.0, 2.0]) for i in range(6)]
    summary = summarize(records, {"e2el_ms": 1000.0}, duration_s=2.0)
    assert summary["min_slo_scale"] == pytest.approx(7.005)
    paths = write_run(tmp_path, records, summary)
    for name in ("latency_cdf.png", "per_tier.png", "attainment_vs_slo_scale.png"):
        assert tmp_path / name in paths and (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_cdfs_are_drawn_as_steps_and_zero_bars_show_with_their_value() -> None:
    figure = pytest.importorskip("matplotlib.figure")
    ax = figure.Figure().subplots()
    line = draw_ecdf(ax, [3.0, 1.0, 2.0])
    assert line.get_drawstyle() == "steps-post" and list(line.get_ydata()) == pytest.approx([0, 1 / 3, 2 / 3, 1])
    container = bars(ax, [0, 1, 2], [0.0, 0.8, None], span=1.0, digits=2)
    assert [p.get_height() for p in container.patches] == [MIN_BAR_FRACTION, 0.8, 0.0]
    assert [t.get_text() for t in ax.texts] == ["0.00", "0.80", "n/a"]
