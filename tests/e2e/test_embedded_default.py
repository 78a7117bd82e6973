"""The embedded default, for real: `cascade serve` starts the CPU workers with the real models,
answers through the OpenAI SDK, survives a worker crash, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from cascade.engines.supervisor import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STARTUP_TIMEOUT_S = 300


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose; its parent reaps it.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "cascade serve exited during start-up"
        try:
            response = httpx.get(f"{base}/ready", timeout=5)
            if response.status_code == 200:
                return response.json()
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"gateway not ready within {timeout_s} s")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes], dict]]:
    port = free_port()
    log_dir = tmp_path_factory.mktemp("serve")
    log = (log_dir / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cascade.cli", "serve", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, cwd=log_dir, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        ready = _wait_ready(base, proc, STARTUP_TIMEOUT_S)
        yield base, proc, ready
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


REASON_TIER = "qwen2.5-coder-1.5b-reason"
WORD_PROBLEM = "A school has 17 classes with 23 students in each class. How many students are in the school?"
# Eight 1.5B branches share two cores: on a CPU without bf16 (4 tok/s at 8 in flight) a branched request of 8
# tokens takes ~40 s (eight prefills) and 256 tokens took 314 s, a quarter of `make test`. The tests check the
# branches' shape, not their answer (a branch cut off by max_tokens finishes like one that stopped), so they ask
# for few tokens and make as few branched requests as they can.
REASON_MAX_TOKENS = 16


def test_fast_and_best_are_answered_by_different_real_tiers(served) -> None:
    base, _, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=300)
    try:
        fast = client.chat.completions.with_raw_response.create(
            model="cascade:fast", messages=[{"role": "user", "content": "Say hello."}], max_tokens=16)
        best = client.chat.completions.with_raw_response.create(
            model="cascade:best", messages=[{"role": "user", "content": WORD_PROBLEM}], max_tokens=REASON_MAX_TOKENS)
        # `best` sends this word problem to the reasoning tier today (the committed router); only if it stops doing
        # so is the tier asked by name, so its branches are checked either way with one branched request at most.
        reason = best if best.parse().model == REASON_TIER else client.chat.completions.with_raw_response.create(
            model=REASON_TIER, messages=[{"role": "user", "content": WORD_PROBLEM}], max_tokens=REASON_MAX_TOKENS)
        direct = client.chat.completions.create(
            model="qwen2.5-coder-0.5b", messages=[{"role": "user", "content": WORD_PROBLEM}], max_tokens=256)
    finally:
        client.close()
    fast_body, routed_best, reason_body = fast.parse(), best.parse(), reason.parse()
    assert fast.headers["x-cascade-tier"] == fast_body.model == "smollm2-135m"
    # `best` takes the router's calibrated operating point: a Qwen tier for a word problem, never SmolLM2.
    assert routed_best.model in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", REASON_TIER)
    assert routed_best.model_extra["cascade"]["quality"] == "best"
    assert routed_best.model_extra["cascade"]["router"] == "learned"
    assert reason.headers["x-cascade-tier"] == reason_body.model == REASON_TIER
    assert fast_body.choices[0].message.content.strip()
    assert reason_body.usage.completion_tokens > 0
    # The 0.5B model answering greedily (the direct tier's worker) gets this one right (17 x 23 = 391; asked
    # bare, "What is 17*23?", it answers 401 without a step-by-step system prompt). The reasoning tier's worker
    # samples (T 0.7 / top_p 0.8, whatever a request asks), so its vote may go either way: only its shape is
    # checked. Adaptive (a first wave of 2 of 8, no pruning): 2 branches when both end with one answer, else all 8
    # (at this token budget both are cut by max_tokens, which is no agreement), and every launched one finishes.
    assert "391" in (direct.choices[0].message.content or "")
    assert reason_body.choices[0].message.content
    branches = reason_body.model_extra["cascade"]["branches"]
    assert branches["launched"] in (2, 8) and branches["finished"] == branches["launched"]
    # Every branch ended one way or another: nothing left running upstream, nothing pruned.
    assert branches["early_stopped"] == branches["pruned"] == 0


def test_route_decision_matches_serving_and_requests_are_logged(served) -> None:
    base, proc, _ = served
    # `balanced` (the 1.5B answering directly, for this question): a routed request without eight branches.
    body = {"model": "cascade:balanced", "messages": [{"role": "user", "content": WORD_PROBLEM}], "max_tokens": 8}
    decision = httpx.post(f"{base}/v1/route", json=body, timeout=30).json()
    served = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    assert decision["object"] == "cascade.route" and served.status_code == 200
    assert decision["tier_name"] == served.headers["x-cascade-tier"] != "smollm2-135m"
    assert decision["router"] == "learned" and decision["out_of_domain"] is False
    # The committed router knows GSM8K only: a greeting is routed by the heuristic, to the cheapest tier.
    hello = {"model": "cascade:balanced", "messages": [{"role": "user", "content": "Say hello."}]}
    decision = httpx.post(f"{base}/v1/route", json=hello, timeout=30).json()
    assert decision["out_of_domain"] is True and decision["router"] == "heuristic"
    assert decision["tier_name"] == "smollm2-135m"
    # The earlier tests' requests are in the traffic log (written beside the gateway's working directory).
    log = Path(f"/proc/{proc.pid}/cwd").resolve() / "logs" / "traffic.jsonl"
    assert log.exists() and log.read_text().count("\n") >= 2


def test_real_stream_reports_usage_and_tier(served) -> None:
    base, _, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=300)
    try:
        stream = client.chat.completions.create(
            model="qwen2.5-coder-0.5b", messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=12, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
    finally:
        client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert {c.model for c in chunks} == {"qwen2.5-coder-0.5b"}


def test_the_real_engine_gets_forwarded_fields_and_a_field_it_would_ignore_is_refused(served) -> None:
    base, _, _ = served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=300, max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as refused:  # transformers serve ignores logprobs
            client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, logprobs=True)
        forwarded = client.chat.completions.create(  # frequency_penalty and logit_bias it applies
            model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            frequency_penalty=0.5, logit_bias={"42": -1})
    finally:
        client.close()
    assert refused.value.param == "logprobs"
    assert forwarded.choices[0].finish_reason in ("stop", "length")


def test_crashed_worker_is_restarted_and_shutdown_leaves_no_orphans(served) -> None:
    base, proc, ready = served
    workers = ready["workers"]
    assert set(workers) == {"smollm2", "qwen", "qwen15", "qwen15-sampling"}
    victim = workers["smollm2"]["pid"]
    os.killpg(victim, signal.SIGKILL)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        state = httpx.get(f"{base}/ready", timeout=10).json()["workers"]["smollm2"]
        if state["restarts"] == 1 and state["pid"] != victim:
            break
        time.sleep(1)
    else:
        raise AssertionError("worker was not restarted")
    # /ready stays 200 meanwhile ("degraded": the other tiers serve), so the restarted tier's own answer says when
    # it is back: 503 at once while its worker loads (refused, or its health checks have not passed again yet).
    while True:
        answer = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        if answer.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert answer.status_code == 200

    pids = [w["pid"] for w in httpx.get(f"{base}/ready", timeout=10).json()["workers"].values()]
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "worker processes outlived the gateway"
