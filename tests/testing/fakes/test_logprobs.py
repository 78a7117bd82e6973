"""The fake engine sends token logprobs when a request asks for them (as SGLang, vLLM and llama.cpp do), streamed
and whole, at the script's `logprob` (per request: `[fake logprob=-2]`), and none otherwise."""

from __future__ import annotations

import json

import httpx
import pytest

from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript


def test_logprobs_only_when_asked_whole_and_streamed() -> None:
    with serve_asgi(FakeEngine(FakeScript(tokens=3))) as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi [fake logprob=-2]"}]}
        whole = httpx.post(f"{url}/v1/chat/completions", json={**body, "logprobs": True}, timeout=5).json()
        content = whole["choices"][0]["logprobs"]["content"]
        assert [e["logprob"] for e in content] == [-2.0] * 3 and content[0]["token"] == "t0 "
        plain = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5).json()
        assert "logprobs" not in plain["choices"][0]
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "logprobs": True, "stream": True},
                          timeout=5) as r:
            chunks = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data: {")]
        streamed = [e["logprob"] for c in chunks for ch in c["choices"] if ch.get("logprobs")
                    for e in ch["logprobs"]["content"]]
        assert streamed == [-2.0] * 3


def test_a_positive_logprob_is_refused() -> None:
    with pytest.raises(ValueError, match="logprob"):
        FakeScript(logprob=0.5)
