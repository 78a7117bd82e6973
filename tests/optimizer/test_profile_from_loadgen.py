"""`cascade profile --from-loadgen`: step costs fitted from a load test's own timings
(cascade.optimizer.profile.fit_trace), on an exact synthetic trace and through real `cascade loadgen`
runs against a batching test engine on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from cascade.data.records import RequestRecord
from cascade.errors import CascadeError
from cascade.optimizer.profile import TracedRequest, fit_trace, load_profile
from cascade.profiler.fit import profile_from_loadgen, profile_from_records
from cascade.testing.asgi import serve_asgi
from tests.optimizer.batching_engine import BatchingEngine


def engine_trace(arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, *, prefill: tuple[float, float],
                 step: tuple[float, float, float]) -> list[TracedRequest]:
    """Exact timings of an engine that prefills one waiting prompt at a time, blocking the batch
    (prefill[0] + prefill[1] * prompt), and otherwise steps the whole batch, one token each
    (step[0] + step[1] * B + step[2] * context tokens)."""
    t, nxt = 0.0, 0
    waiting: deque[int] = deque()
    running: dict[int, list[float]] = {}  # request -> its token times
    done: dict[int, list[float]] = {}
    while len(done) < len(arrivals):
        while nxt < len(arrivals) and arrivals[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if waiting:
            j = waiting.popleft()
            t += prefill[0] + prefill[1] * prompts[j]
            running[j] = [t]
        elif running:
            context = sum(prompts[j] + len(times) for j, times in running.items())
            t += step[0] + step[1] * len(running) + step[2] * context
            for times in running.values():
                times.append(t)
        else:
            t = arrivals[nxt]
        for j in [j for j, times in running.items() if len(times) == outputs[j]]:
            done[j] = running.pop(j)
    return [TracedRequest(sent_s=float(arrivals[j]), ttft_s=done[j][0] - float(arrivals[j]),
                          itl_s=list(np.diff(done[j])), prompt_tokens=int(prompts[j])) for j in range(len(arrivals))]


def test_an_exact_trace_gives_back_the_engines_costs() -> None:
    rng = np.random.default_rng(0)
    n = 120
    arrivals = np.cumsum(rng.exponential(1 / 3.0, n))
    prompts, outputs = rng.integers(20, 400, n), rng.integers(5, 60, n)
    fit = fit_trace(engine_trace(arrivals, prompts, outputs, prefill=(0.02, 1e-4), step=(0.01, 0.004, 2e-5)))
    assert fit.decode.fixed_s == pytest.approx(0.01, rel=1e-6)
    assert fit.decode.per_sequence_s == pytest.approx(0.004, rel=1e-6)
    assert fit.decode.per_context_token_s == pytest.approx(2e-5, rel=1e-6)
    # A lone prefill is timed from the end of the step in progress, read off the other streams.
    assert fit.prefill.per_token_s == pytest.approx(1e-4, rel=1e-6)
    assert fit.prefill.fixed_s == pytest.approx(0.02, rel=1e-6)
    assert fit.prefill_requests >= 10 and sum(p.samples for p in fit.prefill_points) == fit.prefill_requests
    # Decode points: mean step per batch size seen often enough, context per sequence.
    sizes = [p.batch for p in fit.decode_points]
    assert sizes == sorted(sizes) and len(sizes) >= 3
    for point in fit.decode_points:
        assert point.step_s == pytest.approx(0.01 + 0.004 * point.batch + 2e-5 * point.batch * point.context_tokens,
                                             rel=1e-6)


def test_a_profile_names_a_local_model_by_its_directory_never_by_this_machines_path() -> None:
    """`transformers serve` names its model by the local directory; a committed profile keeps the directory's name
    (the embedded model card's), and a load test's folder in its label the same way (cascade/repo_paths.py)."""
    rng = np.random.default_rng(1)
    n = 60
    trace = engine_trace(np.cumsum(rng.exponential(1 / 3.0, n)), rng.integers(20, 400, n), rng.integers(5, 60, n),
                         prefill=(0.02, 1e-4), step=(0.01, 0.004, 2e-5))
    records = [RequestRecord(index=i, prompt_id=f"w:{i}", status=200, sent_s=t.sent_s, ttft_ms=t.ttft_s * 1000,
                             itl_ms=[x * 1000 for x in t.itl_s], prompt_tokens=t.prompt_tokens,
                             output_tokens=len(t.itl_s) + 1, model="/root/.cache/cascade/models/qwen2.5-coder-0.5b")
               for i, t in enumerate(trace)]
    profile = profile_from_records(records)
    assert profile.model == "qwen2.5-coder-0.5b"
    assert profile_from_records(records, model="Qwen/Qwen2.5-7B-Instruct").model == "Qwen/Qwen2.5-7B-Instruct"


def test_a_flat_context_cost_is_dropped_and_too_little_data_is_an_error() -> None:
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / 2.0, 60))
    prompts, outputs = rng.integers(20, 300, 60), rng.integers(5, 40, 60)
    fit = fit_trace(engine_trace(arrivals, prompts, outputs, prefill=(0.02, 1e-4), step=(0.02, 0.003, 0.0)))
    assert fit.decode.per_context_token_s == 0.0
    assert fit.decode.per_sequence_s == pytest.approx(0.003, rel=1e-6)
    with pytest.raises(ValueError, match="at least 3"):
        fit_trace(engine_trace(arrivals[:2], prompts[:2], outputs[:2], prefill=(0.02, 1e-4), step=(0.02, 0.003, 0.0)))
    # Everything arrives at once: no prefill runs alone.
    together = engine_trace(np.zeros(5), prompts[:5], outputs[:5], prefill=(0.02, 1e-4), step=(0.02, 0.003, 0.0))
    with pytest.raises(ValueError, match="prefilled alone"):
        fit_trace(together)


def loadgen(url: str, dataset: Path, out: Path, *, rate: float, n: int, max_tokens: int, seed: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cascade.cli", "loadgen", "--url", url, "--dataset", str(dataset), "--rate", str(rate),
         "--n", str(n), "--max-tokens", str(max_tokens), "--seed", str(seed), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def word_prompts(path: Path, count: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for i, words in enumerate(rng.integers(10, 400, count)):
            f.write(json.dumps({"id": f"w:{i}", "prompt": " ".join(["word"] * int(words))}) + "\n")
    return path


@pytest.mark.timeout(150)
def test_a_load_test_on_a_batching_engine_gives_back_its_costs(tmp_path: Path) -> None:
    engine = BatchingEngine(prefill_fixed_s=0.01, prefill_per_token_s=1e-4, step_fixed_s=0.012,
                            step_per_sequence_s=0.005)
    dataset = word_prompts(tmp_path / "prompts.jsonl", 60, seed=0)
    with serve_asgi(engine) as url:
        loadgen(url, dataset, tmp_path / "run", rate=4.0, n=60, max_tokens=24, seed=0)
    result = subprocess.run([sys.executable, "-m", "cascade.cli", "profile", "--from-loadgen", str(tmp_path / "run"),
                             "--out", str(tmp_path / "p.json"), "--kv-capacity-tokens", "8192", "--json",
                             "--model", "batching-fake"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["source"] == "loadgen" and summary["model"] == "batching-fake"
    profile = load_profile(tmp_path / "p.json")
    assert profile.source == "loadgen" and profile.kv_capacity_tokens == 8192
    # asyncio sleeps overshoot by a millisecond or two on a busy machine; the slopes still come back.
    assert profile.decode.fixed_s == pytest.approx(0.012, abs=0.005)
    assert profile.decode.per_sequence_s == pytest.approx(0.005, rel=0.3)
    assert profile.prefill.per_token_s == pytest.approx(1e-4, rel=0.35)
    assert len(profile.decode_points) >= 2


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    def profile(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cascade.cli", "profile", "--out", str(tmp_path / "p.json"),
                               *args], capture_output=True, text=True, timeout=60)

    missing = profile("--from-loadgen", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    (tmp_path / "junk.jsonl").write_text("not json\n")
    junk = profile("--from-loadgen", str(tmp_path / "junk.jsonl"))
    assert junk.returncode == 2 and "not a cascade loadgen requests file" in junk.stderr
    both = profile("--from-loadgen", str(tmp_path / "junk.jsonl"), "--url", "http://127.0.0.1:9")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    assert not (tmp_path / "p.json").exists()

    no_usage = tmp_path / "no_usage.jsonl"
    no_usage.write_text("".join(json.dumps({"index": i, "prompt_id": f"x:{i}", "sent_s": float(i), "status": 200,
                                            "ttft_ms": 50.0, "itl_ms": [10.0, 10.0], "output_tokens": 3}) + "\n"
                                for i in range(5)))
    with pytest.raises(CascadeError, match="no prompt token counts"):
        profile_from_loadgen(no_usage)
