"""The GPU emulator (cascade/testing/fakes/gpu.py) answers in SGLang's own shapes, as the strict fake does: every
streamed chunk and every whole completion is what the pinned SGLang's serializers write for the same content, and a
refused prompt is SGLang's error object."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from cascade.optimizer.profile import load_profile
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.answers import LengthAnswers
from cascade.testing.fakes.gpu import GpuSGLang
from tests.contract.sglang_protocol import SGLangProtocol
from tests.contract.sglang_wire import sglang_completion, sglang_error, sglang_event, sse_events

PROFILE = Path(__file__).resolve().parents[2] / "models" / "gpu" / "profiles" / "h200" / "qwen2.5-coder-0.5b.json"
BODY = {"model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "messages": [{"role": "user", "content": "count to five"}],
        "max_tokens": 5, "rid": "contract-1"}


def test_the_emulators_answers_are_sglangs_shapes(sglang: SGLangProtocol) -> None:
    engine = GpuSGLang(load_profile(PROFILE), LengthAnswers(), time_scale=0.1, kv_capacity_tokens=64)
    with serve_asgi(engine) as url:
        stream = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "stream": True,
                                                                 "stream_options": {"include_usage": True}})
        whole = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "rid": "contract-2"})
        refused = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "messages": [
            {"role": "user", "content": "word " * 100}]})
    events = sse_events(stream.content)
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    for chunk in chunks:
        assert chunk == json.loads(sglang_event(sglang, chunk)[6:]), f"not SGLang's chunk shape: {chunk}"
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert whole.json() == json.loads(sglang_completion(sglang, whole.json()))
    assert whole.json()["choices"][0]["finish_reason"] == "length"
    assert refused.status_code == 400
    assert refused.json() == json.loads(sglang_error(sglang, refused.json()))
