"""`cascade loadgen` end to end against real HTTP servers on 127.0.0.1 (the fake engine, the gateway)."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from cascade.cli import main
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from loadgen.report import markdown
from loadgen.run import LoadConfig, run_load
from tests.gateway.gateway_setup import running_gateway
from tests.servers import dead_url
from tests.service.pricing import running_priced_gateway

CONTRACT_KEYS = {"requests", "completed", "failed", "achieved_rate_rps", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms",
                 "goodput_rps", "slo_attainment", "accuracy"}


class Limited:
    """An ASGI wrapper serving at most `limit` requests at once (the rest queue): a server with a knee."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit
        self.sem: asyncio.Semaphore | None = None
        self.in_flight = self.max_in_flight = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        if self.sem is None:
            self.sem = asyncio.Semaphore(self.limit)
        async with self.sem:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["loadgen", "--no-progress", *args])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 and "--json" in args else None), captured.err


def test_short_run_writes_every_output_and_prints_the_contract_keys(tmp_path, capsys) -> None:
    data = write_jsonl(tmp_path / "qa.jsonl", [
        {"prompt": "[fake answer=The_answer_is_18]", "reference": "#### 18"},
        {"prompt": "[fake answer=I_think_7]", "reference": "#### 18"},
    ])
    out = tmp_path / "run"
    with serve_asgi(FakeEngine(FakeScript(ttft_ms=5, itl_ms=1))) as url:
        code, summary, err = run_cli(["--url", url, "--dataset", data, "--rate", "50", "--n", "20",
                                      "--slo", "ttft_ms=1000,tpot_ms=500,e2el_ms=5000",
                                      "--quality-mix", "fast=0.5,best=0.5", "--out", str(out), "--json"], capsys)
    assert code == 0, err
    assert summary is not None and set(summary) >= CONTRACT_KEYS
    assert list(summary)[: len(CONTRACT_KEYS)] == [k for k in summary if k in CONTRACT_KEYS]
    assert set(summary["ttft_ms"]) >= {"p50", "p90", "p99"}
    assert (summary["requests"], summary["completed"], summary["failed"]) == (20, 20, 0)
    assert summary["slo_attainment"] == 1.0
    assert 0.0 < summary["accuracy"] < 1.0  # half the prompts answer 18
    assert summary["accuracy"] == summary["correct_within_slo"]
    assert set(summary["by_quality"]) == {"fast", "best"}
    for name in ("requests.jsonl", "summary.json", "report.md", "latency_cdf.png", "per_tier.png",
                 "attainment_vs_slo_scale.png"):
        assert (out / name).stat().st_size > 0, name
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and all(r["tier"] == "fake-model" and r["correct"] == (r["extracted"] == "18") for r in rows)
    assert "## Breakdown" in (out / "report.md").read_text()


def test_measured_ttft_and_itl_match_the_fake_servers_script(tmp_path) -> None:
    with serve_asgi(FakeEngine(FakeScript(ttft_ms=40, itl_ms=15, tokens=6))) as url:
        summary, records = run_load(LoadConfig(url=url, dataset="random", rate=20, n=16, arrival="constant",
                                               progress=False))
    assert summary["failed"] == 0
    ttft = statistics.median(r.ttft_ms for r in records if r.ttft_ms is not None)
    itl = statistics.median(x for r in records for x in r.itl_ms)
    assert ttft == pytest.approx(40, abs=4)  # the in-process test server shares the GIL: a loose bound
    assert itl == pytest.approx(15, abs=3)
    assert all(r.output_tokens == 6 and len(r.itl_ms) == 5 for r in records)
    assert summary["tpot_ms"]["p50"] == pytest.approx(15, abs=3)


def test_a_dead_server_gives_failed_records_not_an_exception(tmp_path, capsys) -> None:
    code, summary, _ = run_cli(["--url", dead_url(), "--dataset", "random", "--rate", "100", "--n", "5",
                                "--out", str(tmp_path / "run"), "--json"], capsys)
    assert code == 0
    assert summary is not None and (summary["completed"], summary["failed"]) == (0, 5)
    assert summary["slo_attainment"] == 0.0
    assert any("cannot connect" in e for e in summary["errors"])


def test_http_errors_stalls_and_bad_status_are_recorded_per_request(tmp_path) -> None:
    data = write_jsonl(tmp_path / "faults.jsonl", [
        {"prompt": "[fake status=500]"}, {"prompt": "[fake status=429]"}, {"prompt": "[fake stall_after=1]"},
        {"prompt": "fine"},
    ])
    with serve_asgi(FakeEngine(FakeScript(tokens=3))) as url:
        _, records = run_load(LoadConfig(url=url, dataset=data, rate=50, n=4, seed=1, timeout_s=0.5,
                                         progress=False))
        by_prompt = {r.prompt_id: r for r in records}
    errors = {pid: r.error for pid, r in by_prompt.items()}
    assert errors["faults:0"] == "HTTP 500: scripted failure 500"
    assert errors["faults:1"] == "HTTP 429: scripted failure 429"
    assert errors["faults:2"] == "timed out after 0.5 s"
    assert by_prompt["faults:2"].ttft_ms is not None  # one token arrived before the stall
    assert errors["faults:3"] is None


def test_quality_hints_reach_the_gateway_and_the_served_tier_is_reported(tmp_path) -> None:
    with running_gateway(FakeScript(tokens=4)) as (gateway_url, _, _):
        summary, records = run_load(LoadConfig(url=gateway_url, dataset="random", rate=40, n=16, seed=2,
                                               quality_mix={"fast": 0.5, "best": 0.5}, progress=False))
    assert summary["failed"] == 0
    assert {(r.quality, r.tier) for r in records} == {("fast", "tier-small"), ("best", "tier-large")}
    assert {r.tier_index for r in records} == {0, 2}
    assert set(summary["by_tier"]) == {"tier-small", "tier-large"}


def test_closed_loop_keeps_the_requested_number_in_flight(tmp_path) -> None:
    server = Limited(FakeEngine(FakeScript(ttft_ms=20, tokens=2)), limit=100)
    with serve_asgi(server) as url:
        summary, _ = run_load(LoadConfig(url=url, dataset="random", concurrency=3, n=12, progress=False))
    assert summary["completed"] == 12
    assert server.max_in_flight == 3
    assert summary["run"]["arrival"] == "closed"


def test_trace_replay_uses_the_traces_response_lengths(tmp_path) -> None:
    trace = tmp_path / "burst.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,ChatGPT,40,3,43,Conversation log\n1,ChatGPT,80,5,85,Conversation log\n"
                     "2,ChatGPT,20,2,22,Conversation log\n")
    with serve_asgi(FakeEngine(FakeScript(tokens=16))) as url:
        _, records = run_load(LoadConfig(url=url, dataset="random", arrival="trace", trace=str(trace),
                                               rate=20.0, progress=False))
    assert [r.output_tokens for r in records] == [3, 5, 2]
    assert [r.scheduled_s for r in records] == pytest.approx([0.0, 0.05, 0.1])


def test_sweep_finds_the_knee_of_a_concurrency_limited_server(tmp_path, capsys) -> None:
    # 2 slots x 20 ms per request: about 100 rps of capacity.
    server = Limited(FakeEngine(FakeScript(ttft_ms=20, tokens=1)), limit=2)
    out = tmp_path / "sweep"
    with serve_asgi(server) as url:
        code, summary, err = run_cli(["--url", url, "--dataset", "random", "--arrival", "constant", "--n", "40",
                                      "--slo", "ttft_ms=60", "--sweep", "25,50,200,400", "--sweep-refine", "1",
                                      "--attainment-target", "0.9", "--out", str(out), "--json"], capsys)
    assert code == 0, err
    assert summary is not None
    sweep = summary["sweep"]
    assert sweep["max_sustainable_rate_rps"] == 50
    assert sweep["first_failing_rate_rps"] == 125  # 200 failed, then the bisection step at 125 failed too
    assert [p["rate_rps"] for p in sweep["points"]] == [25, 50, 125, 200]
    assert sweep["points"][-1]["slo_attainment"] < 0.9
    assert all(p["min_slo_scale"] is not None for p in sweep["points"][:2])
    assert (out / "attainment_vs_rate.png").stat().st_size > 0
    assert (out / "rate-200" / "summary.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset", "random", "--n", "2"], "--rate RPS is required"),
    (["--dataset", "random", "--rate", "1", "--slo", "ttft=3"], "--slo takes"),
    (["--dataset", "nope", "--rate", "1"], "unknown dataset"),
    (["--dataset", "random", "--rate", "1", "--quality-mix", "fast"], "--quality-mix takes"),
    (["--dataset", "random", "--rate", "1", "--sweep", "1,x", "--slo", "ttft_ms=5"], "--sweep takes"),
])
def test_bad_options_are_one_line_errors_with_exit_2(tmp_path, capsys, args: list[str], message: str) -> None:
    code, _, err = run_cli(["--url", "http://127.0.0.1:9", *args, "--out", str(tmp_path / "x")], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err


def test_non_streaming_requests_report_latency_tokens_and_text() -> None:
    with serve_asgi(FakeEngine(FakeScript(ttft_ms=10, itl_ms=2, tokens=4))) as url:
        summary, records = run_load(LoadConfig(url=url, dataset="random", rate=50, n=4, stream=False,
                                               progress=False))
    assert summary["failed"] == 0
    for r in records:
        assert r.output_tokens == 4 and r.output == "t0 t1 t2 t3 "
        assert r.e2el_ms is not None and r.e2el_ms >= 15
        assert r.ttft_ms == pytest.approx(r.e2el_ms, abs=0.5)  # one body: the first token is the last
        assert r.tpot_ms is None  # undefined without a stream, not 0
    assert summary["tpot_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_loadgen_help_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    probe = ("import sys\nfrom cascade.cli import main\ntry:\n    main(['loadgen', '--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('torch', 'litestar', 'sklearn', 'numpy', 'matplotlib', 'loadgen.run') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("stream", [True, False])
def test_a_priced_gateways_costs_are_read_and_cost_per_correct_answer_reported(tmp_path, stream: bool) -> None:
    data = write_jsonl(tmp_path / "qa.jsonl", [
        {"prompt": "[fake answer=The_answer_is_18]", "reference": "#### 18"},
        {"prompt": "[fake answer=The_answer_is_7]", "reference": "#### 18"},
    ])
    with running_priced_gateway() as gateway_url:
        summary, records = run_load(LoadConfig(url=gateway_url, dataset=data, rate=40, n=8, seed=1, stream=stream,
                                               progress=False))
    assert summary["failed"] == 0 and all(r.cost is not None and r.cost > 0 for r in records)
    cost = summary["cost"]
    correct = sum(1 for r in records if r.correct)
    assert cost["currency"] == "USD" and cost["requests"] == 8 and 0 < correct < 8
    assert cost["total"] == pytest.approx(sum(r.cost or 0 for r in records))
    assert cost["per_correct_answer"] == pytest.approx(cost["total"] / correct)
    assert "cost per correct answer" in markdown(summary, [], plotted=False)


def test_without_a_terminal_progress_is_printed_as_lines_and_cut_answers_are_counted(monkeypatch, capsys) -> None:
    from loadgen import runner

    monkeypatch.setattr(runner, "PROGRESS_LINE_S", 0.05)
    with serve_asgi(FakeEngine(FakeScript(ttft_ms=20, itl_ms=20, tokens=8))) as url:
        summary, records = run_load(LoadConfig(url=url, dataset="random", rate=40, n=12, max_tokens=4))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("loadgen: ")]
    assert len(lines) >= 2 and lines[-1] == "loadgen: 12/12 done, 0 in flight, 0 errors"
    assert "\r" not in err  # no bar redrawn into a log
    assert summary["truncated"] == 12 == sum(r.finish_reason == "length" for r in records)
