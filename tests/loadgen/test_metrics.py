"""Summaries on hand-computed examples."""

from __future__ import annotations

import math

import pytest

from cascade.data.records import RequestRecord
from loadgen.metrics import min_slo_scale, parse_slo, percentiles, slo_scale_needed, summarize


def rec(i: int, ttft: float | None = 100.0, e2el: float | None = 1000.0, tokens: int = 10, error: str | None = None,
        tier: str | None = "small", quality: str | None = "fast", reference: str | None = None,
        correct: bool | None = None, sent: float | None = None) -> RequestRecord:
    tpot = None if ttft is None or e2el is None or tokens < 2 else (e2el - ttft) / (tokens - 1)
    return RequestRecord(index=i, prompt_id=f"p{i}", ttft_ms=ttft, e2el_ms=e2el, tpot_ms=tpot, output_tokens=tokens,
                         error=error, tier=tier, quality=quality, reference=reference, correct=correct,
                         sent_s=float(i) if sent is None else sent, itl_ms=[10.0] * max(0, tokens - 1))


def test_parse_slo_reads_bounds_and_refuses_unknown_keys() -> None:
    assert parse_slo("ttft_ms=500,tpot_ms=50, e2el_ms=10000") == {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2el_ms": 10000.0}
    assert parse_slo(None) == {}
    with pytest.raises(ValueError, match="--slo takes"):
        parse_slo("latency=3")
    with pytest.raises(ValueError, match="must be > 0"):
        parse_slo("ttft_ms=0")


def test_percentiles_interpolate_like_numpy() -> None:
    p = percentiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert p == {"p50": 3.0, "p90": 4.6, "p99": 4.96, "mean": 3.0}
    assert percentiles([])["p50"] is None


def test_goodput_attainment_and_accuracy_on_a_hand_computed_run() -> None:
    # 4 requests over 10 s: two meet ttft<=200 and e2el<=2000, one is too slow, one failed.
    records = [
        rec(0, ttft=100, e2el=1000, reference="18", correct=True),
        rec(1, ttft=150, e2el=1900, reference="18", correct=False, tier="big", quality="best"),
        rec(2, ttft=300, e2el=1500, reference="7", correct=True, tier="big", quality="best"),
        rec(3, ttft=None, e2el=None, tokens=0, error="HTTP 500: boom", tier=None, reference="5", correct=False),
    ]
    s = summarize(records, {"ttft_ms": 200, "e2el_ms": 2000}, duration_s=10.0)
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["goodput_rps"] == pytest.approx(0.2)          # 2 good / 10 s
    assert s["slo_attainment"] == pytest.approx(0.5)       # 2 of 4
    assert s["accuracy"] == pytest.approx(0.5)             # 2 correct of 4 graded
    assert s["correct_within_slo"] == pytest.approx(0.25)  # only request 0 is both
    assert s["correct_goodput_rps"] == pytest.approx(0.1)  # 1 correct-and-on-time / 10 s
    assert s["request_throughput_rps"] == pytest.approx(0.3)
    assert s["output_throughput_tps"] == pytest.approx(3.0)
    assert s["achieved_rate_rps"] == pytest.approx(1.0)    # sends 1 s apart
    assert s["ttft_ms"]["p50"] == 150.0
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert [r.meets_slo for r in records] == [True, True, False, False]
    assert set(s["by_tier"]) == {"small", "big", "unknown"}
    assert s["by_tier"]["big"]["slo_attainment"] == pytest.approx(0.5)
    assert s["by_quality"]["best"]["accuracy"] == pytest.approx(0.5)
    assert s["by_quality"]["fast"]["failed"] == 1


def test_correct_goodput_counts_only_right_answers_in_time_with_a_seeded_bootstrap_interval() -> None:
    # 1,000 requests over 100 s: 300 right and on time, 200 right but late, 500 wrong and on time.
    records = ([rec(i, reference="1", correct=True) for i in range(300)]
               + [rec(i, e2el=5000, reference="1", correct=True) for i in range(300, 500)]
               + [rec(i, reference="1", correct=False) for i in range(500, 1000)])
    s = summarize(records, {"e2el_ms": 2000}, duration_s=100.0)
    assert s["goodput_rps"] == pytest.approx(8.0) and s["correct_goodput_rps"] == pytest.approx(3.0)
    low, high = s["correct_goodput_ci95"]
    # Binomial(1000, 0.3) / 100 s: sd 0.145 rps, so the 95% interval is about 3.0 -/+ 0.28.
    assert 2.65 < low < 2.8 < 3.2 < high < 3.35
    assert summarize(records, {"e2el_ms": 2000}, duration_s=100.0)["correct_goodput_ci95"] == [low, high]
    assert s["by_quality"]["fast"]["correct_goodput_rps"] == pytest.approx(3.0)
    ungraded = summarize([rec(0), rec(1)], {}, duration_s=1.0)
    assert ungraded["correct_goodput_rps"] is None and ungraded["correct_goodput_ci95"] is None


def test_tpot_is_per_request_and_itl_pools_chunk_gaps() -> None:
    records = [rec(0, ttft=100, e2el=1000, tokens=10), rec(1, ttft=100, e2el=300, tokens=3)]
    s = summarize(records, {}, duration_s=1.0)
    assert s["tpot_ms"]["p50"] == pytest.approx((100 + 100) / 2)  # 900/9 and 200/2
    assert s["itl_ms"]["p50"] == 10.0
    assert s["slo_attainment"] == 1.0  # no SLO: every completed request counts


def test_slo_scale_needed_is_the_worst_ratio_to_the_bounds() -> None:
    slo = {"ttft_ms": 200.0, "e2el_ms": 2000.0}
    assert slo_scale_needed(rec(0, ttft=100, e2el=3000), slo) == pytest.approx(1.5)
    assert slo_scale_needed(rec(0, error="x"), slo) == math.inf
    assert slo_scale_needed(rec(0, tokens=1), {"tpot_ms": 1.0}) == 0.0  # no TPOT for one token


def test_min_slo_scale_is_cascadias_95_percent_point() -> None:
    slo = {"e2el_ms": 100.0}
    records = [rec(i, ttft=1, e2el=float(10 * (i + 1))) for i in range(20)]  # scales 0.1 .. 2.0
    assert min_slo_scale(records, slo, 0.95) == pytest.approx(1.9)  # 19 of 20 need <= 1.9
    assert min_slo_scale(records, slo, 0.5) == pytest.approx(1.0)
    records[-1].error = records[-2].error = "failed"
    assert min_slo_scale(records, slo, 0.95) is None  # 2 failures > 5%


def test_cost_per_correct_answer_counts_what_every_request_cost_over_the_right_answers() -> None:
    records = [rec(i, reference="1", correct=i < 2) for i in range(4)]  # 2 right of 4
    for r, cost in zip(records, [0.25, 0.5, 0.75, 1.5], strict=True):
        r.cost, r.cost_currency = cost, "USD"
    records.append(rec(4, error="HTTP 429: quota", reference="1", correct=False))  # refused: no cost
    s = summarize(records, {}, duration_s=1.0)
    assert s["cost"] == {"currency": "USD", "total": 3.0, "requests": 4, "per_request": 0.75,
                         "per_correct_answer": 1.5}
    assert s["by_tier"]["small"]["cost"]["total"] == 3.0
    assert summarize([rec(0), rec(1)], {}, duration_s=1.0)["cost"] is None  # no response carried a cost
    nothing_right = [rec(0, reference="1", correct=False)]
    nothing_right[0].cost = 2.0
    assert summarize(nothing_right, {}, duration_s=1.0)["cost"]["per_correct_answer"] is None


def test_a_servers_hostile_costs_are_left_out_of_the_sums() -> None:
    records = [rec(i, reference="1", correct=True) for i in range(4)]
    for r, cost in zip(records, [math.inf, -1.0, math.nan, 0.5], strict=True):
        r.cost = cost
    s = summarize(records, {}, duration_s=1.0)
    assert s["cost"]["total"] == 0.5 and s["cost"]["requests"] == 1 and s["cost"]["per_correct_answer"] == 0.125
