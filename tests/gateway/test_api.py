"""The gateway's OpenAI wire format, driven by the real `openai` SDK over real HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from cascade.testing.fakes.engine import FakeScript
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import post_chat, running_gateway, user


@pytest.fixture(scope="module")
def gw():
    with running_gateway(FakeScript(tokens=8)) as urls:
        yield urls


@pytest.fixture
def client(gw):
    sdk = openai.OpenAI(base_url=f"{gw[0]}/v1", api_key="unused", max_retries=0, timeout=10)
    yield sdk
    sdk.close()


def test_non_streaming_completion_has_openai_shape_and_names_the_tier(client) -> None:
    raw = client.chat.completions.with_raw_response.create(model="cascade:fast", messages=user(), max_tokens=5)
    completion = raw.parse()
    assert raw.headers["x-cascade-tier"] == completion.model == TIERS[0]
    assert completion.id.startswith("chatcmpl-") and completion.object == "chat.completion"
    assert completion.created > 1_700_000_000
    assert completion.choices[0].message.content == "t0 t1 t2 t3 t4 "
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 5
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 5
    info = completion.model_extra["cascade"]
    assert info["tier"] == 0 and info["tier_name"] == TIERS[0] and info["quality"] == "fast"


def test_streaming_completion_ends_with_usage_and_done(gw) -> None:
    sdk = openai.OpenAI(base_url=f"{gw[0]}/v1", api_key="unused", max_retries=0)
    try:
        chunks = list(sdk.chat.completions.create(
            model="cascade:best", messages=user(), stream=True, stream_options={"include_usage": True}))
    finally:
        sdk.close()
    assert {c.model for c in chunks} == {TIERS[2]}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(f"t{i} " for i in range(8))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_stream_without_include_usage_sends_no_usage(gw) -> None:
    with httpx.stream("POST", f"{gw[0]}/v1/chat/completions", timeout=10,
                      json={"model": "cascade", "messages": user(), "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all('"usage"' not in line for line in lines)


@pytest.mark.parametrize(("kwargs", "tier"), [
    ({"model": "cascade:best"}, 2),
    ({"model": "cascade", "extra_body": {"quality": "best"}}, 2),
    ({"model": "cascade", "extra_headers": {"X-Cascade-Quality": "best"}}, 2),
    ({"model": "cascade", "extra_body": {"quality": 0.999}}, 2),
    ({"model": "cascade", "extra_body": {"quality": "fast"}}, 0),
    ({"model": "cascade:best", "extra_body": {"quality": "fast"}}, 0),  # the body field wins
    ({"model": TIERS[1]}, 1),  # a tier's own name bypasses routing
])
def test_quality_hint_in_every_form_selects_the_tier(client, kwargs, tier) -> None:
    completion = client.chat.completions.create(messages=user("What is 12*7?"), max_tokens=2, **kwargs)
    assert completion.model == TIERS[tier]
    assert completion.model_extra["cascade"]["tier"] == tier


def test_n_choices_non_streaming(client) -> None:
    completion = client.chat.completions.create(model="cascade:fast", messages=user(), n=3, max_tokens=2, seed=7)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert completion.usage.completion_tokens == 6


def test_n_choices_streaming_interleaves_indices(client) -> None:
    chunks = list(client.chat.completions.create(model="cascade:fast", messages=user(), n=2, max_tokens=3,
                                                 stream=True))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: "t0 t1 t2 ", 1: "t0 t1 t2 "}


def test_models_lists_tiers_and_aliases(client) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids[:4] == ["cascade", "cascade:fast", "cascade:balanced", "cascade:best"]
    assert set(TIERS) <= set(ids)


def test_health_ready_and_metrics(gw) -> None:
    base = gw[0]
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{base}/ready")
    assert ready.status_code == 200 and ready.json()["tiers"] == dict.fromkeys(TIERS, True)
    post_chat(base, {"model": "cascade:fast", "messages": user(), "max_tokens": 2})
    metrics = httpx.get(f"{base}/metrics").text
    assert f'cascade_requests_total{{outcome="ok",tier="{TIERS[0]}"}}' in metrics
    for series in ("cascade_request_latency_seconds_bucket", "cascade_in_flight_requests",
                   "cascade_router_decision_seconds_count", "cascade_output_tokens_total"):
        assert series in metrics


def test_ttft_is_observed_for_streams(gw) -> None:
    base = gw[0]
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                      json={"model": TIERS[1], "messages": user(), "stream": True}) as response:
        response.read()
    assert f'cascade_ttft_seconds_count{{tier="{TIERS[1]}"}}' in httpx.get(f"{base}/metrics").text


def test_tpot_is_the_time_per_token_after_the_first_of_a_stream() -> None:
    # 6 tokens 30 ms apart: (end - first token) / 5 is 30 ms, give or take the loop's jitter.
    with running_gateway(FakeScript(tokens=6, itl_ms=30)) as (base, _, _):
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                          json={"model": TIERS[1], "messages": user(), "stream": True}) as response:
            response.read()
        metrics = httpx.get(f"{base}/metrics").text
    count = f'cascade_tpot_seconds_count{{tier="{TIERS[1]}"}} 1.0'
    total = next(float(line.split()[-1]) for line in metrics.splitlines()
                 if line.startswith(f'cascade_tpot_seconds_sum{{tier="{TIERS[1]}"}}'))
    assert count in metrics and 0.02 < total < 0.2, total
    assert f'cascade_tpot_seconds_count{{tier="{TIERS[0]}"}}' not in metrics  # no stream there: no series


def test_sampling_params_are_accepted_and_max_completion_tokens_is_honoured(gw) -> None:
    base = gw[0]
    response = post_chat(base, {"model": "cascade:fast", "messages": user(), "temperature": 0.5, "top_p": 0.9,
                                "stop": ["x"], "seed": 1, "max_completion_tokens": 2})
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 2


def test_api_keys_are_enforced_when_configured() -> None:
    with running_gateway(extra='[gateway]\napi_keys = ["sekrit"]\n') as (base, _, _):
        denied = post_chat(base, {"model": "cascade", "messages": user()})
        allowed = post_chat(base, {"model": "cascade", "messages": user()}, {"Authorization": "Bearer sekrit"})
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
    assert allowed.status_code == 200
