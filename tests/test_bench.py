"""`cascade bench branches` end to end against the fake engine over real HTTP (the contract keys)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cascade.cli import main
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript

RIGHT = "3_*_6_=_18.|So_the_answer_is_18.|####_18"


def bench(tmp_path: Path, capsys, *extra: str) -> dict:
    """`cascade bench branches --json` on 3 scripted questions against a fresh fake engine."""
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        write_inputs(tmp_path, url)
        code = main(["bench", "branches", "--config", str(tmp_path / "cascade.toml"), "--dataset",
                     str(tmp_path / "q.jsonl"), "--n-questions", "3", "--rate", "20", "--n", "4", "--m", "2",
                     "--out", str(tmp_path / "out"), "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def write_inputs(tmp_path: Path, url: str) -> None:
    (tmp_path / "cascade.toml").write_text(f"""
[[tiers]]
name = "thinker"
default_max_tokens = 200
backends = [{{ kind = "openai", url = "{url}", model = "fake" }}]
""")
    rows = [{"id": f"q{i}", "prompt": f"Question {i} [fake answer={RIGHT}] [fake@seed=3 answer= tokens=60 itl_ms=10]",
             "reference": "#### 18"} for i in range(3)]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_bench_branches_prints_the_contract_keys_and_sart_spends_fewer_tokens(tmp_path, capsys) -> None:
    result = bench(tmp_path, capsys, "--sweep", "2:1", "--save-branches", str(tmp_path / "b.jsonl"))
    methods = result["methods"]
    assert set(methods) == {"vanilla", "self_consistency", "sart", "early_stop_only", "prune_only"}
    for summary in methods.values():
        assert {"accuracy", "latency_s_mean", "latency_s_p95", "tokens_mean"} <= set(summary)
    assert methods["vanilla"]["accuracy"] == methods["sart"]["accuracy"] == 1.0
    assert methods["sart"]["tokens_mean"] < methods["self_consistency"]["tokens_mean"]
    assert methods["sart"]["branches"]["early_stopped"] >= 3
    # What each method decoded at (an openai backend decodes as asked): vanilla greedy, branches sampled.
    ran = result["config"]["methods"]
    assert ran["vanilla"] == {"tier": "thinker", "temperature": 0.0, "top_p": None}
    assert ran["sart"] == ran["self_consistency"] == {"tier": "thinker", "temperature": 0.7, "top_p": 1.0}
    assert (result["config"]["temperature"], result["config"]["top_p"]) == (0.7, 1.0)
    assert {(p["method"], p["n"], p["m"]) for p in result["sweep"]} == {("self_consistency", 2, 1), ("sart", 2, 1)}
    assert (tmp_path / "out" / "sweep.png").exists() and (tmp_path / "out" / "summary.json").exists()
    saved = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert saved and all(set(row) >= {"id", "text", "correct"} for row in saved)


def test_a_sweep_over_m_runs_self_consistency_once_per_n_and_repeats_no_finished_run(tmp_path, capsys) -> None:
    result = bench(tmp_path, capsys, "--methods", "self_consistency,sart", "--sweep", "4:1,4:2")
    assert [(p["method"], p["m"]) for p in result["sweep"]] == [
        ("self_consistency", 1), ("sart", 1), ("self_consistency", 2), ("sart", 2)]
    by = {(p["method"], p["m"]): p for p in result["sweep"]}
    assert by[("self_consistency", 1)] | {"m": 2} == by[("self_consistency", 2)]  # the same run, reported twice
    assert by[("sart", 2)] | {"method": "sart"} == {**result["methods"]["sart"], "method": "sart", "n": 4, "m": 2}
    # Three runs reached the engine: SC(4), SART(4, 2), SART(4, 1); the repeats reused them.
    records = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    # Each record names the M that ran: self-consistency waits for all 4 whatever the sweep's M.
    assert sorted({(r["method"], r["m"]) for r in records}) == [("sart", 1), ("sart", 2), ("self_consistency", 4)]
    assert len(records) == 9


def test_each_requests_branches_reach_the_sink_when_it_completes_not_at_the_end(tmp_path) -> None:
    """So a long `--save-branches` run keeps what it finished if it is stopped."""
    import asyncio

    import numpy as np

    from cascade.bench.methods import BenchSettings, run_method
    from cascade.config import load_config
    from cascade.label import select_prompts
    from cascade.tiers.build import build_tiers

    events: list[tuple[str, str]] = []

    async def run(url: str) -> None:
        tier = build_tiers(load_config(tmp_path / "cascade.toml"), {})[0]
        prompts = select_prompts(str(tmp_path / "q.jsonl"), 3, 0)
        try:
            await run_method(tier, "self_consistency", BenchSettings(n=3, m=3, rate=1.0), prompts,
                             np.array([0.0, 0.4, 0.8]), on_done=lambda r: events.append(("done", r.id)),
                             on_branches=lambda rows: events.append(("branches", ",".join({r["id"] for r in rows}))))
        finally:
            await tier.backend.aclose()

    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        write_inputs(tmp_path, url)
        asyncio.run(run(url))
    # Each request's branches (one id per call) arrive just before that request is counted done.
    assert [kind for kind, _ in events] == ["branches", "done"] * 3
    assert [events[i][1] for i in range(0, 6, 2)] == [events[i][1] for i in range(1, 6, 2)]


def test_branch_settings_not_given_are_the_tiers_own(tmp_path, capsys) -> None:
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        write_inputs(tmp_path, url)
        toml = (tmp_path / "cascade.toml").read_text().replace(
            "default_max_tokens = 200\n",
            "default_max_tokens = 200\nbranches = { n = 3, m = 1, alpha = 0.4, beta = 2, k = 1, slots = 6 }\n")
        (tmp_path / "cascade.toml").write_text(toml)
        args = ["bench", "branches", "--config", str(tmp_path / "cascade.toml"), "--dataset", str(tmp_path / "q.jsonl"),
                "--n-questions", "3", "--rate", "20", "--methods", "sart", "--json"]
        assert main(args) == 0
        served = json.loads(capsys.readouterr().out)
        assert main([*args, "--m", "2", "--alpha", "0"]) == 0  # a flag given overrides the tier's own
        overridden = json.loads(capsys.readouterr().out)
    picked = {k: served["config"][k] for k in ("n", "m", "alpha", "beta", "k", "slots")}
    assert picked == {"n": 3, "m": 1, "alpha": 0.4, "beta": 2, "k": 1, "slots": 6}
    assert served["methods"]["sart"]["branches"]["launched"] == 9
    assert (overridden["config"]["m"], overridden["config"]["alpha"], overridden["config"]["n"]) == (2, 0, 3)


def test_adaptive_stops_at_a_first_wave_that_agrees_and_says_so_in_its_branch_counts(tmp_path, capsys) -> None:
    result = bench(tmp_path, capsys, "--methods", "self_consistency,adaptive", "--first-wave", "2",
                   "--save-branches", str(tmp_path / "b.jsonl"))
    methods = result["methods"]
    # Seeds 0 and 1 give the same answer on every question: two branches each, where self-consistency runs 4.
    assert methods["adaptive"]["branches"]["launched"] == 3 * 2 and methods["adaptive"]["accuracy"] == 1.0
    assert methods["self_consistency"]["branches"]["launched"] == 3 * 4
    assert methods["adaptive"]["tokens_mean"] < methods["self_consistency"]["tokens_mean"]
    assert result["config"]["methods"]["adaptive"]["first_wave"] == 2  # the summary says which wave ran
    # Both methods' finished branches are saved, each row naming its method (the readers that need all N of a
    # question, benchmarks/reasoning/branch_outcomes.py and reasoning/sart_replay.py, keep self-consistency's alone).
    saved = Counter(json.loads(line)["method"] for line in (tmp_path / "b.jsonl").read_text().splitlines())
    assert saved == {"self_consistency": 3 * 4, "adaptive": 3 * 2}


def test_adaptive_with_a_wave_margin_says_so_in_its_summary(tmp_path, capsys) -> None:
    result = bench(tmp_path, capsys, "--methods", "adaptive", "--first-wave", "2", "--wave-margin", "2")
    # Seeds 0 and 1 agree on every question, which settles it at the first wave, margin or not.
    assert result["methods"]["adaptive"]["branches"]["launched"] == 3 * 2
    ran = result["config"]["methods"]["adaptive"]
    assert (ran["first_wave"], ran["wave_margin"]) == (2, 2)


def test_adaptive_with_a_negative_wave_margin_is_refused(tmp_path, capsys) -> None:
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        write_inputs(tmp_path, url)
        code = main(["bench", "branches", "--config", str(tmp_path / "cascade.toml"), "--dataset",
                     str(tmp_path / "q.jsonl"), "--methods", "adaptive", "--wave-margin", "-1"])
    assert code == 2 and "--wave-margin" in capsys.readouterr().err


def test_adaptive_with_a_first_wave_not_below_n_is_refused(tmp_path, capsys) -> None:
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        write_inputs(tmp_path, url)
        code = main(["bench", "branches", "--config", str(tmp_path / "cascade.toml"), "--dataset",
                     str(tmp_path / "q.jsonl"), "--n", "4", "--methods", "adaptive", "--first-wave", "4"])
    assert code == 2 and "--first-wave" in capsys.readouterr().err
