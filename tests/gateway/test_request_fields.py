"""The request fields OpenAI's and the engines' clients send (issue 65 item 4), from the `openai` SDK through a gateway
over fake engines of each kind: an SGLang tier and a vLLM-like OpenAI tier get the engine extras (`ignore_eos`,
`min_tokens`, `stop_token_ids`, `skip_special_tokens`), a backend that lists one in `unsupported_params` and the
embedded engine (`transformers serve`, which answers a field outside its params class with a 422) do not, and OpenAI's
own (`store`, `service_tier`, `verbosity`, `stream_options.include_obfuscation`) reach no engine. What is dropped is
named in `cascade.note` and in `x-cascade-dropped-params`, on whole answers and streams alike; a greedy tier says
that `temperature`, `seed` and `n` do nothing there. `/v1/models/{id}` and `/docs` are served."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from cascade.config import decode_config
from cascade.gateway.app import create_app
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from tests.gateway.gateway_setup import post_chat, user
from tests.gateway.test_reasoning_effort import embedded_service
from tests.servers import Recorder

EXTRAS = {"ignore_eos": True, "min_tokens": 2, "stop_token_ids": [151645, 7], "skip_special_tokens": False}
LENGTH_EXTRAS = ("ignore_eos", "min_tokens", "skip_special_tokens")  # dropped where untaken; stop_token_ids refused
OPENAI_ONLY = {"store": True, "service_tier": "flex", "verbosity": "low"}
NEVER_SENT = ("store", "service_tier", "verbosity")
DROPPED = "x-cascade-dropped-params"
SLASHED = "qwen/qwen3-8b"  # a tier's name may hold `/`, as model ids do


def ladder(sglang: str, openai_url: str) -> str:
    return (f'[[tiers]]\nname = "{SLASHED}"\ndefault_max_tokens = 16\n'
            f'backends = [{{ kind = "sglang", url = "{sglang}", model = "Qwen/Qwen3-8B" }}]\n'
            f'[[tiers]]\nname = "vllm"\ndefault_max_tokens = 16\n'
            f'backends = [{{ kind = "openai", url = "{openai_url}", model = "m" }}]\n'
            f'[[tiers]]\nname = "partial"\ndefault_max_tokens = 16\n'
            f'backends = [{{ kind = "openai", url = "{openai_url}", model = "m", unsupported_params = ["ignore_eos"] }}]\n')


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Recorder, Recorder]]:
    """(gateway URL, the SGLang engine's recorder, the OpenAI engine's recorder)."""
    sglang, other = Recorder(FakeSGLang(FakeScript(tokens=4))), Recorder(FakeEngine(FakeScript(tokens=4)))
    with ExitStack() as stack:
        sglang_url, other_url = stack.enter_context(serve_asgi(sglang)), stack.enter_context(serve_asgi(other))
        gateway = Gateway(decode_config(ladder(sglang_url, other_url)))
        yield stack.enter_context(serve_asgi(gateway.app, lifespan="on")), sglang, other


@pytest.fixture
def sdk(served: tuple[str, Recorder, Recorder]) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0, timeout=10)
    yield client
    client.close()


@pytest.mark.parametrize("tier", [SLASHED, "vllm"])
def test_the_sdks_fields_reach_an_engine_that_takes_them_and_openais_own_reach_none(
        served: tuple[str, Recorder, Recorder], sdk: openai.OpenAI, tier: str) -> None:
    _, sglang, other = served
    recorder = sglang if tier == SLASHED else other
    recorder.exchanges.clear()
    raw = sdk.chat.completions.with_raw_response.create(
        model=tier, messages=user(), store=True, service_tier="flex", verbosity="low", extra_body=EXTRAS)
    assert raw.parse().choices[0].message.content
    assert raw.headers[DROPPED] == "store,service_tier,verbosity"
    note = raw.http_response.json()["cascade"]["note"]
    assert "`store` (cascade stores no chat completions)" in note and "`service_tier`" in note
    [body] = recorder.bodies
    assert {k: body[k] for k in EXTRAS} == EXTRAS
    assert not set(NEVER_SENT) & set(body) and body["stream_options"] == {"include_usage": True}


def test_a_stream_names_what_it_dropped_in_its_headers_and_its_last_chunk(
        served: tuple[str, Recorder, Recorder], sdk: openai.OpenAI) -> None:
    _, sglang, _ = served
    sglang.exchanges.clear()
    raw = sdk.chat.completions.with_raw_response.create(
        model=SLASHED, messages=user(), stream=True, stream_options={"include_usage": True, "include_obfuscation": True},
        extra_body=EXTRAS)
    assert raw.headers[DROPPED] == "stream_options.include_obfuscation"
    chunks = list(raw.parse())
    assert "`stream_options.include_obfuscation`" in chunks[-1].model_extra["cascade"]["note"]
    [body] = sglang.bodies
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True


def test_an_engine_that_does_not_take_an_extra_does_not_get_it_and_the_response_says_so(
        served: tuple[str, Recorder, Recorder]) -> None:
    base, _, other = served
    other.exchanges.clear()
    response = post_chat(base, {"model": "partial", "messages": user(), **EXTRAS})
    quiet = post_chat(base, {"model": "partial", "messages": user(), "ignore_eos": False, "store": False,
                             "service_tier": "auto", "verbosity": "medium"})
    assert response.status_code == quiet.status_code == 200, response.text
    assert response.headers[DROPPED] == "ignore_eos"
    assert "`ignore_eos` (not taken by the engines of tier `partial`)" in response.json()["cascade"]["note"]
    sent, asked_nothing = other.bodies
    assert "ignore_eos" not in sent and sent["min_tokens"] == 2 and sent["stop_token_ids"] == [151645, 7]
    # Values every engine decodes with anyway, or that cascade serves as asked, are no drop.
    assert DROPPED not in quiet.headers and quiet.json()["cascade"]["note"] is None
    assert "ignore_eos" not in asked_nothing and not set(NEVER_SENT) & set(asked_nothing)


def test_min_tokens_past_the_limit_is_refused_naming_it(served: tuple[str, Recorder, Recorder]) -> None:
    base = served[0]
    past_default = post_chat(base, {"model": "vllm", "messages": user(), "min_tokens": 17})
    past_own = post_chat(base, {"model": "vllm", "messages": user(), "min_tokens": 9, "max_completion_tokens": 8})
    within = post_chat(base, {"model": "vllm", "messages": user(), "min_tokens": 17, "max_completion_tokens": 17})
    for refused in (past_default, past_own):
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "min_tokens", refused.text
    assert "tier `vllm`'s default limit of 16" in past_default.json()["error"]["message"]
    assert within.status_code == 200


# --- the embedded engine -----------------------------------------------------------------------------------------


@contextmanager
def embedded(tmp_path: Path) -> Iterator[tuple[str, Recorder]]:
    """The embedded ladder's own config behind the gateway's routes, every worker the recorded fake engine."""
    recorder = Recorder(FakeEngine(FakeScript(tokens=3)))
    with serve_asgi(recorder) as url:
        service = embedded_service(url, tmp_path)

        async def close() -> None:
            await asyncio.gather(*(tier.backend.aclose() for tier in service.tiers))

        with serve_asgi(create_app(service, on_shutdown=[close]), lifespan="on") as base:
            yield base, recorder


def test_the_embedded_engine_gets_no_extra_and_a_greedy_tier_says_what_it_ignores(tmp_path: Path) -> None:
    length = {k: EXTRAS[k] for k in LENGTH_EXTRAS}
    with embedded(tmp_path) as (base, recorder):
        tier = "smollm2-135m"
        whole = post_chat(base, {"model": tier, "messages": user(), "temperature": 0.7, "seed": 3, "n": 2, **length})
        with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=10,
                          json={"model": "cascade", "messages": user(), "stream": True, **length}) as streamed:
            stream_headers, _ = streamed.headers, streamed.read()
        greedy = post_chat(base, {"model": tier, "messages": user(), "temperature": 0})
        refused = post_chat(base, {"model": tier, "messages": user(), "stop_token_ids": [2]})
        empty = post_chat(base, {"model": tier, "messages": user(), "stop_token_ids": []})
    assert whole.status_code == 200, whole.text
    assert empty.status_code == 200, empty.text  # no stop token asked for: nothing to refuse
    assert whole.headers[DROPPED] == stream_headers[DROPPED] == "ignore_eos,min_tokens,skip_special_tokens"
    note = whole.json()["cascade"]["note"]
    for said in ("`temperature` not applied: tier `smollm2-135m` decodes greedily", "`seed` has no effect",
                 "`n` = 2 gives identical choices", "`min_tokens` (not taken by the engines of tier `smollm2-135m`)"):
        assert said in note
    assert not any(set(LENGTH_EXTRAS) & set(body) for body in recorder.bodies)
    # Temperature 0 is what a greedy tier does; a stop token it cannot stop at would change the answer: a 400.
    assert greedy.status_code == 200 and greedy.json()["cascade"]["note"] is None
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stop_token_ids"


# --- routes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", ["cascade", "cascade:best", "cascade:0.9", "cascade: Fast ", "vllm", SLASHED,
                                      "qwen%2Fqwen3-8b"])
def test_a_served_model_id_is_an_openai_model_object(served: tuple[str, Recorder, Recorder], model_id: str) -> None:
    response = httpx.get(f"{served[0]}/v1/models/{model_id}", timeout=10)
    assert response.status_code == 200, response.text
    assert response.json() == {"id": model_id.replace("%2F", "/"), "object": "model", "created": 0,
                               "owned_by": "cascade"}


def test_the_sdk_retrieves_a_model_and_gets_a_404_for_an_unknown_one(sdk: openai.OpenAI) -> None:
    assert sdk.models.retrieve("cascade:balanced").id == "cascade:balanced"
    assert sdk.models.retrieve(SLASHED).id == SLASHED  # sent as `qwen%2Fqwen3-8b`
    with pytest.raises(openai.NotFoundError) as info:
        sdk.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize("model_id", [
    "nope", "cascade:", "cascade:2", "cascade:nan", "cascade:0", "cascade:best:x", "x" * 300, "cascade:" + "9" * 5000,
    "%00", "%FF%FE", "..%2F..%2Fhealth", "%E2%80%AE" * 40, "cascade%00", "vllm%20", "a/b/c/d",
])
def test_an_unknown_or_hostile_model_id_is_a_404_model_not_found(served: tuple[str, Recorder, Recorder],
                                                                 model_id: str) -> None:
    response = httpx.get(f"{served[0]}/v1/models/{model_id}", timeout=10)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
    assert len(error["message"]) < 500  # the id echoed cut, whatever its length


def test_docs_is_a_self_contained_page_naming_every_documented_route(served: tuple[str, Recorder, Recorder]) -> None:
    base = served[0]
    page, document = httpx.get(f"{base}/docs", timeout=10), httpx.get(f"{base}/openapi.json", timeout=10).json()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert 'href="/openapi.json"' in text
    for path in document["paths"]:
        assert f"<code>{path}</code>" in text
    assert not any(mark in text for mark in ("http://", "https://", "<script", "src="))  # nothing from elsewhere
