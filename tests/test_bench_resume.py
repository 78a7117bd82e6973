"""A `cascade bench branches --out DIR` run cut short resumes: the rerun of the same command sends only the
requests without a record in DIR/requests.jsonl (or with an error), summarizes all of them, and appends to
--save-branches without duplicating a row; --fresh starts over. Fake engine over real HTTP; the engine's
request count is what reached it (cascade/bench/runs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from cascade.cli import main
from cascade.machine import fingerprint
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from tests.test_bench import write_inputs

QUESTIONS = 3
N = 2  # self-consistency's branches: N requests to the engine per question, vanilla's one


def bench(tmp_path: Path, capsys, *extra: str, questions: int = QUESTIONS) -> tuple[dict, int]:
    """The same command every time (vanilla and self-consistency on 3 questions): its JSON and the requests the
    (fresh) engine received."""
    bodies: list[dict[str, Any]] = []

    def record(script: FakeScript, body: dict[str, Any]) -> FakeScript:
        bodies.append(body)
        return script

    with serve_asgi(FakeEngine(FakeScript(tokens=8), hook=record)) as url:
        write_inputs(tmp_path, url)
        code = main(["bench", "branches", "--config", str(tmp_path / "cascade.toml"), "--dataset",
                     str(tmp_path / "q.jsonl"), "--n-questions", str(questions), "--rate", "20", "--n", str(N),
                     "--m", "1", "--methods", "vanilla,self_consistency", "--out", str(tmp_path / "out"),
                     "--save-branches", str(tmp_path / "b.jsonl"), "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out), len(bodies)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_rerun_sends_only_the_requests_a_stopped_run_left_and_summarizes_them_all(tmp_path, capsys) -> None:
    first, sent = bench(tmp_path, capsys)
    assert sent == QUESTIONS * (1 + N) and first["resumed"] == 0
    requests = tmp_path / "out" / "requests.jsonl"
    rows = [json.loads(line) for line in lines(requests)]
    assert len(rows) == 2 * QUESTIONS and all(r["key"] for r in rows)
    assert {r["machine"] for r in rows} == {fingerprint()}  # latencies say which CPU measured them
    saved = lines(tmp_path / "b.jsonl")
    assert len(saved) == QUESTIONS * N

    # As if the run had been stopped: one vanilla request ended in an error, two self-consistency requests
    # never finished (their branches were saved already), and the last line was cut short.
    vanilla = [r for r in rows if r["method"] == "vanilla"]
    consistency = [r for r in rows if r["method"] == "self_consistency"]
    kept = [*vanilla[:2], {**vanilla[2], "error": "backend down", "correct": False}, consistency[0]]
    requests.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"id": "q1", "corr')

    second, sent = bench(tmp_path, capsys)
    assert sent == 1 + 2 * N  # the errored vanilla request and two self-consistency requests
    assert second["resumed"] == 3
    assert (second["methods"]["vanilla"]["resumed"], second["methods"]["self_consistency"]["resumed"]) == (2, 1)
    for method, summary in second["methods"].items():
        assert summary["requests"] == QUESTIONS and summary["errors"] == 0, method
        assert summary["accuracy"] == first["methods"][method]["accuracy"]
    assert lines(tmp_path / "b.jsonl") == saved  # appended to, and no request's branches twice

    # Everything finished: nothing reaches the engine (nor starts), and the summary is the same.
    third, sent = bench(tmp_path, capsys)
    assert sent == 0 and third["resumed"] == 2 * QUESTIONS
    assert {m: s["accuracy"] for m, s in third["methods"].items()} == {
        m: s["accuracy"] for m, s in second["methods"].items()}


def test_fresh_ignores_a_previous_runs_records_and_starts_its_files_over(tmp_path, capsys) -> None:
    bench(tmp_path, capsys)
    again, sent = bench(tmp_path, capsys, "--fresh")
    assert sent == QUESTIONS * (1 + N) and again["resumed"] == 0
    assert len(lines(tmp_path / "out" / "requests.jsonl")) == 2 * QUESTIONS
    assert len(lines(tmp_path / "b.jsonl")) == QUESTIONS * N


def test_a_changed_command_does_not_reuse_the_records_of_another(tmp_path, capsys) -> None:
    bench(tmp_path, capsys)
    other, sent = bench(tmp_path, capsys, "--max-tokens", "300")
    assert sent == QUESTIONS * (1 + N) and other["resumed"] == 0
    assert len(lines(tmp_path / "out" / "requests.jsonl")) == 4 * QUESTIONS  # both runs' records, apart


def test_more_questions_run_only_the_questions_they_add(tmp_path, capsys) -> None:
    # The seeded sample of 1 question is the first of the sample of 2 (both below the dataset's 3 rows).
    first, sent = bench(tmp_path, capsys, questions=1)
    assert sent == 1 + N and first["resumed"] == 0
    more, sent = bench(tmp_path, capsys, questions=2)
    assert sent == 1 + N and more["resumed"] == 2
    assert all(s["requests"] == 2 for s in more["methods"].values())
    saved = [json.loads(line)["id"] for line in lines(tmp_path / "b.jsonl")]
    assert len(saved) == 2 * N and len(set(saved)) == 2  # each question's branches once


def test_resume_keys_of_methods_without_a_first_wave_are_those_recorded_before_it_existed() -> None:
    from cascade.bench.methods import BenchSettings
    from cascade.bench.runs import BenchRun, resume_key

    # The self-consistency run of issue 31 (8 branches on Qwen2.5-Coder-1.5B, GSM8K train) was recorded with
    # this key before `first_wave` existed; a changed key would rerun every question it finished.
    settings = BenchSettings(n=8, m=8, alpha=0.5, beta=4, k=2, rate=0.1, max_tokens=512, temperature=0.7, top_p=0.8,
                             slots=32, seed=0)
    tier = "qwen2.5-coder-1.5b-reason"
    assert resume_key(BenchRun(method="self_consistency", settings=settings, tier=tier), "gsm8k-train") \
        == "4f18a19330274597"
    adaptive = {resume_key(BenchRun(method="adaptive", settings=msgspec.structs.replace(settings, first_wave=w),
                                    tier=tier), "gsm8k-train") for w in (2, 3)}
    assert len(adaptive) == 2 and "4f18a19330274597" not in adaptive
    # Adaptive with two waves keeps the key its 1.5B test run was recorded with before `wave_margin` existed.
    two_waves = msgspec.structs.replace(settings, first_wave=2)
    assert resume_key(BenchRun(method="adaptive", settings=two_waves, tier=tier), "gsm8k-train") == "824e076705c1b294"
    assert resume_key(BenchRun(method="adaptive", settings=msgspec.structs.replace(two_waves, wave_margin=2),
                               tier=tier), "gsm8k-train") != "824e076705c1b294"


def test_a_sampling_seed_samples_the_same_questions_again_as_a_run_of_its_own(tmp_path, capsys) -> None:
    """--sampling-seed: the same questions at the same arrivals, sampled with other seeds; its records and saved
    branches are its own (never resumed from, nor taken for, the first sample's)."""
    bodies: list[dict[str, Any]] = []

    def record(script: FakeScript, body: dict[str, Any]) -> FakeScript:
        bodies.append(body)
        return script

    def run(*extra: str) -> dict:
        with serve_asgi(FakeEngine(FakeScript(tokens=8), hook=record)) as url:
            write_inputs(tmp_path, url)
            assert main(["bench", "branches", "--config", str(tmp_path / "cascade.toml"), "--dataset",
                         str(tmp_path / "q.jsonl"), "--n-questions", str(QUESTIONS), "--rate", "20", "--n", str(N),
                         "--methods", "self_consistency", "--out", str(tmp_path / "out"), "--save-branches",
                         str(tmp_path / "b.jsonl"), "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    first = run()
    seeds_first = sorted(b["seed"] for b in bodies)
    bodies.clear()
    again = run("--sampling-seed", "1")
    assert again["resumed"] == 0 and len(bodies) == QUESTIONS * N  # a run of its own: every request sent
    assert set(again["questions"]) == set(first["questions"]) and again["config"]["sampling_seed"] == 1
    assert not set(seeds_first) & {b["seed"] for b in bodies}  # sampled with other seeds
    bodies.clear()
    assert run("--sampling-seed", "1")["resumed"] == QUESTIONS and not bodies  # and it resumes as itself
    saved = [json.loads(line) for line in lines(tmp_path / "b.jsonl")]
    assert len(saved) == 2 * QUESTIONS * N and sorted(r.get("seed", 0) for r in saved) == [0] * 6 + [1] * 6
