"""`cascade label` end to end against the fake engine over real HTTP: grading, branches, resumption."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from cascade.cli import main
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.waiting import eventually
from tests.gateway.gateway_setup import small_and_thinker_toml

RIGHT = "3_*_6_=_18.|####_18"
WRONG = "3_*_6_=_19.|####_19"


def write_inputs(tmp_path, url: str) -> tuple[str, str]:
    (tmp_path / "cascade.toml").write_text(small_and_thinker_toml(url))
    # The small tier answers wrongly on q1; the thinker's branches vote 18 everywhere.
    rows = [{"id": "q0", "prompt": f"Q0 [fake answer={RIGHT}]", "reference": "#### 18"},
            {"id": "q1", "prompt": f"Q1 [fake answer={RIGHT}] [fake@fake-small answer={WRONG}]", "reference": "#### 18"},
            {"id": "q2", "prompt": "Q2 no reference"}]
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(tmp_path / "cascade.toml"), str(tmp_path / "q.jsonl")


def test_label_grades_every_tier_runs_branches_and_resumes(tmp_path, capsys) -> None:
    engine = FakeEngine(FakeScript(tokens=8))
    out = tmp_path / "outcomes.jsonl"
    with serve_asgi(engine) as url:
        config, dataset = write_inputs(tmp_path, url)
        args = ["label", "--config", config, "--dataset", dataset, "--out", str(out), "--concurrency", "4"]
        assert main(args) == 0
    # Per prompt: one request on the small tier and two or three branches on the thinker. The third branch
    # is cancelled once two finish, before its request is sent or after (it may even reach the engine just
    # after the labeller returns), so the second run gets an engine of its own to count on.
    assert 2 * (1 + 2) <= engine.stats.requests <= 2 * (1 + 3), engine.stats
    again = FakeEngine(FakeScript(tokens=8))
    with serve_asgi(again) as url:
        write_inputs(tmp_path, url)
        assert main(args) == 0  # everything labelled already: nothing is sent again
    assert again.stats.requests == 0
    assert "wrote 0 rows" in capsys.readouterr().out
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"q0", "q1"}  # q2 has no reference to grade against
    assert rows["q0"]["tiers"]["small"]["correct"] and not rows["q1"]["tiers"]["small"]["correct"]
    assert rows["q1"]["tiers"]["small"]["answer"] == "19"
    thinker = rows["q1"]["tiers"]["thinker"]
    assert thinker["correct"] and thinker["decode_tokens"] >= thinker["output_tokens"] > 0
    assert "decode_tokens" not in rows["q1"]["tiers"]["small"]
    assert "prompt" not in rows["q0"]  # no dataset text unless --with-text


def test_label_logprobs_records_each_answers_token_confidence_where_the_engine_returns_them(tmp_path) -> None:
    out = tmp_path / "outcomes.jsonl"
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        config, dataset = write_inputs(tmp_path, url)
        toml = (tmp_path / "cascade.toml").read_text()
        # The thinker's engine says it returns no logprobs: it is asked nothing and records none.
        (tmp_path / "cascade.toml").write_text(toml.replace('model = "fake-big" }',
                                                            'model = "fake-big", unsupported_params = ["logprobs"] }'))
        (tmp_path / "q.jsonl").write_text((tmp_path / "q.jsonl").read_text().replace("Q1 ", "Q1 [fake logprob=-1] "))
        assert main(["label", "--config", config, "--dataset", dataset, "--out", str(out), "--logprobs"]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    sure, unsure = rows["q0"]["tiers"]["small"]["token_confidence"], rows["q1"]["tiers"]["small"]["token_confidence"]
    assert sure["group"] == 32 and sure["tokens"] == 6 and abs(sure["lowest_group"] - 0.9512) < 1e-3
    assert abs(unsure["mean"] - 0.3679) < 1e-3  # exp(-1)
    assert "token_confidence" not in rows["q0"]["tiers"]["thinker"]


def test_a_prompt_that_fails_on_a_tier_is_not_written_and_is_retried(tmp_path, capsys) -> None:
    engine = FakeEngine(FakeScript(tokens=8))
    out = tmp_path / "outcomes.jsonl"
    with serve_asgi(engine) as url:
        config, _ = write_inputs(tmp_path, url)
        rows = [{"id": "ok", "prompt": f"[fake answer={RIGHT}]", "reference": "#### 18"},
                {"id": "broken", "prompt": f"[fake answer={RIGHT}] [fake@fake-big status=500]", "reference": "#### 18"}]
        (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        args = ["label", "--config", config, "--dataset", str(tmp_path / "d.jsonl"), "--out", str(out)]
        assert main(args) == 0
        assert "1 prompts failed" in capsys.readouterr().out
        assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["ok"]
        before = engine.stats.requests
        assert main(args) == 0  # the failed prompt is tried again, the labelled one is not
        assert engine.stats.requests == before + 4


def _ctrl_c_reaches() -> None:
    """In the child: SIGINT at its default and unblocked. A background job without job control starts with SIGINT
    ignored, and ignored or blocked signals pass through exec: twice in full CI runs (2026-11-26) the command never
    saw the SIGINT and labelled every prompt (exit 0), though it passes alone; this tests Ctrl-C, not the parent."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_prompts_in_flight_at_once_and_keeps_written_rows(tmp_path) -> None:
    # One quick prompt, then prompts that would stream for ~100 s: SIGINT must end the command within
    # seconds, cancel their upstream streams, and keep the row already written.
    engine = FakeEngine(FakeScript(tokens=8))
    out = tmp_path / "outcomes.jsonl"
    with serve_asgi(engine) as url:
        config, _ = write_inputs(tmp_path, url)
        rows = [{"id": "quick", "prompt": f"[fake answer={RIGHT}]", "reference": "#### 18"}]
        rows += [{"id": f"slow{i}", "prompt": "[fake tokens=1000 itl_ms=100]", "reference": "#### 18"}
                 for i in range(6)]
        (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        command = [sys.executable, "-m", "cascade.cli", "label", "--config", config,
                   "--dataset", str(tmp_path / "d.jsonl"), "--out", str(out), "--concurrency", "4"]
        with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, preexec_fn=_ctrl_c_reaches) as proc:
            try:
                assert eventually(lambda: out.is_file() and b"quick" in out.read_bytes()
                                  and engine.stats.in_flight > 0, within_s=60)
                started = time.monotonic()
                proc.send_signal(signal.SIGINT)
                # Far below the ~100 s the prompts would stream; 15 s was once not enough on 2 cores at load ~6.
                assert proc.wait(timeout=45) == 130, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() - started < 45
            finally:
                proc.kill()
        assert eventually(lambda: engine.stats.in_flight == 0, within_s=5)  # upstream streams were cancelled
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["quick"]


def test_labelling_some_tiers_starts_only_their_workers_and_an_unknown_tier_is_refused(tmp_path, capsys) -> None:
    from cascade.engines.embedded import embedded_config
    from cascade.tiers.build import workers_of

    ladder = embedded_config()
    assert workers_of(ladder, ["qwen2.5-coder-1.5b-reason"]) == {"qwen15-sampling"}  # only the worker its tier runs on
    assert workers_of(ladder, ["smollm2-135m", "qwen2.5-coder-0.5b"]) == {"smollm2", "qwen"}
    engine = FakeEngine(FakeScript(tokens=8))
    with serve_asgi(engine) as url:
        config, dataset = write_inputs(tmp_path, url)
        out = tmp_path / "outcomes.jsonl"
        assert main(["label", "--config", config, "--dataset", dataset, "--out", str(out), "--tiers", "nope"]) == 2
        assert "unknown tier(s) nope" in capsys.readouterr().err and not out.exists()
        assert main(["label", "--config", config, "--dataset", dataset, "--out", str(out), "--tiers", "small"]) == 0
    assert all(set(json.loads(line)["tiers"]) == {"small"} for line in out.read_text().splitlines())
    assert engine.stats.requests == 2  # q0 and q1 on the small tier; the thinker was never asked


def test_save_branches_appends_each_reasoning_tiers_branch_texts_without_the_prompt(tmp_path) -> None:
    out, branches = tmp_path / "outcomes.jsonl", tmp_path / "branches.jsonl"
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as url:
        config, dataset = write_inputs(tmp_path, url)
        assert main(["label", "--config", config, "--dataset", dataset, "--out", str(out),
                     "--save-branches", str(branches)]) == 0
    saved = [json.loads(line) for line in branches.read_text().splitlines()]
    assert {r["id"] for r in saved} == {"q0", "q1"} and {r["tier"] for r in saved} == {"thinker"}  # small: no branches
    assert all(set(r) == {"id", "tier", "seed", "branch", "text", "state", "correct"} for r in saved)
    finished = [r for r in saved if r["state"] == "finished"]
    assert len(finished) >= 4 and all(r["correct"] and r["text"].endswith("18") for r in finished)
    assert not any("Q0" in r["text"] or "Q1" in r["text"] for r in saved)  # model output only, never the prompt
