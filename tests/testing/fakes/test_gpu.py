"""The GPU emulator on the wire (cascade/testing/fakes/gpu.py): `cascade profile` recovers the profile it runs on, a
full KV cache queues requests, /abort_request frees KV at once, and `cascade fake-server --gpu-profile` serves it."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest

from cascade.optimizer.profile import DecodeModel, PrefillModel, Profile, load_profile
from cascade.profiler.fit import Settings, measure
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.answers import LengthAnswers
from cascade.testing.fakes.gpu import GpuSGLang
from cascade.testing.servers import fake_engine

PROFILES = Path(__file__).resolve().parents[3] / "models" / "gpu" / "profiles" / "h200"
SCALE = 4.0  # wall seconds per emulated second: steps long enough that the HTTP round trip stays small


def test_cascade_profile_recovers_the_profile_the_emulator_runs() -> None:
    given = load_profile(PROFILES / "deepseek-r1-distill-qwen-7b.json")
    with serve_asgi(GpuSGLang(given, time_scale=SCALE)) as url:
        got = asyncio.run(measure(Settings(url=url, prompt_tokens=(128, 512, 2048), repeats=2, max_batch=8,
                                           output_tokens=8, time_limit_s=60)))
    assert got.kv_capacity_tokens == given.kv_capacity_tokens  # read from /server_info
    assert got.prompt_tokens_source == "usage"
    d, r = given.decode, got.decode
    for point in got.decode_points:
        context = point.batch * point.context_tokens
        expected = d.fixed_s + d.per_sequence_s * point.batch + d.per_context_token_s * context
        fitted = (r.fixed_s + r.per_sequence_s * point.batch + r.per_context_token_s * context) / SCALE
        assert fitted == pytest.approx(expected, rel=0.15), point
    # Prefill: the cost per token, and the TTFT of the longest prompt. (The fitted fixed part also holds the HTTP
    # round trip and first-chunk delivery, as a client sees them: on this machine, not on the GPU.)
    assert got.prefill.per_token_s / SCALE == pytest.approx(given.prefill.per_token_s, rel=0.15)
    longest = max(p.prompt_tokens for p in got.prefill_points)
    assert (got.prefill.fixed_s + got.prefill.per_token_s * longest) / SCALE == pytest.approx(
        given.prefill.fixed_s + given.prefill.per_token_s * longest, rel=0.15)


async def _gauges(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await client.get(f"{url}/metrics")).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^sglang:(\w+)\{[^}]*\} (\S+)$", text, re.M)}


async def _stream(client: httpx.AsyncClient, url: str, rid: str) -> tuple[int, str]:
    body = {"model": "m", "rid": rid, "messages": [{"role": "user", "content": "word " * 100}], "max_tokens": 100,
            "stream": True}
    tokens, finish = 0, ""
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            tokens += '"content":"t' in line
            if m := re.search(r'"finish_reason":"(\w+)"', line):
                finish = m.group(1)
    return tokens, finish


def test_a_full_kv_cache_queues_requests_and_an_abort_frees_its_kv_at_once() -> None:
    flat = Profile(model="m", kv_capacity_tokens=400, prefill=PrefillModel(fixed_s=0.002, per_token_s=0.0),
                   decode=DecodeModel(fixed_s=0.010))  # each request needs 100 + 0.7 x 100: two fit, one waits
    engine = GpuSGLang(flat, LengthAnswers())

    async def run(url: str) -> tuple[dict[str, float], dict[str, float], dict[str, float], list[tuple[int, str]]]:
        async with httpx.AsyncClient(timeout=30) as client:
            streams = [asyncio.create_task(_stream(client, url, f"r{i}")) for i in range(3)]
            while engine.gpu.used_tokens < 200:
                await asyncio.sleep(0.005)
            full = await _gauges(client, url)
            await client.post(f"{url}/abort_request", json={"rid": "r0"})
            after = await _gauges(client, url)
            while after["num_queue_reqs"]:  # the queued request starts in r0's place at the next iteration
                after = await _gauges(client, url)
            done = await asyncio.gather(*streams)
            return full, after, await _gauges(client, url), done

    with serve_asgi(engine) as url:
        full, after, idle, done = asyncio.run(run(url))
    assert (full["num_running_reqs"], full["num_queue_reqs"]) == (2, 1)
    assert full["token_usage"] == pytest.approx(full["kv_used_tokens"] / 400)
    # r0's KV is free at once: r2 runs in its place while r1 is still far from done (100 steps of 10 ms).
    assert (after["num_running_reqs"], after["num_queue_reqs"]) == (2, 0)
    assert after["kv_used_tokens"] <= 400
    assert done[0][1] == "abort" and done[0][0] < 100
    assert done[1:] == [(100, "length"), (100, "length")]  # the queued one ran too, none failed
    assert (idle["num_running_reqs"], idle["num_queue_reqs"], idle["kv_used_tokens"]) == (0, 0, 0)


def test_usage_counts_the_prompt_a_word_a_token() -> None:
    with serve_asgi(GpuSGLang(load_profile(PROFILES / "qwen2.5-coder-0.5b.json"), LengthAnswers(3),
                              time_scale=0.1)) as url:
        body = {"model": "m", "messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "what is two plus two"}]}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).json()
    assert answer["usage"]["prompt_tokens"] == 7
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_a_prompt_longer_than_the_kv_cache_is_a_400() -> None:
    with serve_asgi(GpuSGLang(load_profile(PROFILES / "qwen2.5-coder-0.5b.json"), kv_capacity_tokens=50)) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "stream": True, "messages": [
            {"role": "user", "content": "word " * 60}]}, timeout=10)
    assert response.status_code == 400
    assert "Input length (60 tokens) exceeds the maximum allowed length (49 tokens)" in response.json()["message"]


def test_fake_server_with_a_gpu_profile_serves_the_emulator(tmp_path: Path) -> None:
    profile = PROFILES / "deepseek-r1-distill-qwen-7b.json"
    with fake_engine(tmp_path, "--gpu-profile", str(profile), "--time-scale", "0.5", "--tokens", "4",
                     "--kv-capacity-tokens", "5000", "--model", "r1-7b") as url:
        info = httpx.get(f"{url}/server_info").json()
        models = httpx.get(f"{url}/v1/models").json()
        started = time.perf_counter()
        answer = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "hi"}]}, timeout=10).json()
        took = time.perf_counter() - started
    assert info["max_total_num_tokens"] == 5000
    assert [m["id"] for m in models["data"]] == ["r1-7b"]
    assert answer["model"] == "m" and answer["usage"]["completion_tokens"] == 4
    assert took > 0.5 * 4 * 0.0064  # four steps of the 7B at half speed, at least
