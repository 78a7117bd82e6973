"""SGLangPRMScorer against SGLang's recorded `/classify` wire format (tests/fixtures/sglang/), over real HTTP.

The recorded bodies are served verbatim by `Replay` on 127.0.0.1, which also records what the client
sent, so these tests pin both directions: the exact request (chat format, one `<extra_0>` after each
step, cut after the last marker) and how the PRM's per-input P(positive) is read and aggregated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from cascade.branches.prm_client import (
    DEFAULT_PRM_TIMEOUTS,
    NEUTRAL_SCORE,
    STEP_MARKER,
    SYSTEM_PROMPT,
    PRMScorerConfig,
    SGLangPRMScorer,
    prm_input,
)
from cascade.branches.scoring import Scorer, split_steps
from cascade.config import Timeouts
from cascade.errors import BackendError, BackendFailed, BackendTimeout, BackendUnavailable, ConfigError
from cascade.testing.asgi import serve_asgi
from tests.servers import Replay, Reply, dead_url

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sglang"
CLASSIFY = ("POST", "/classify")
MODEL = "Qwen/Qwen2.5-Math-PRM-7B"
QUESTION = "What is 2+3*4?"
STEPS = [
    "Multiplication comes before addition, so first compute 3*4 = 12.",
    "Then add 2: 2 + 12 = 14.",
    "The answer is \\boxed{14}.",
]
# The rewards in prm_classify_response_prefixes.json, one per step marker.
STEP_REWARDS = [0.9931640625, 0.65185546875, 0.9716796875]
TIMEOUTS = Timeouts(connect_s=1.0, read_s=5.0, total_s=10.0)
T = TypeVar("T")
Replayed = tuple[str, Replay]


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def with_scorer(url: str, use: Callable[[SGLangPRMScorer], Awaitable[T]], aggregate: str = "last",
                timeouts: Timeouts = TIMEOUTS) -> T:
    async def main() -> T:
        scorer = SGLangPRMScorer(url, MODEL, timeouts, aggregate=aggregate)
        try:
            return await use(scorer)
        finally:
            await scorer.aclose()

    return asyncio.run(main())


def score(url: str, aggregate: str = "last", steps: list[str] = STEPS, timeouts: Timeouts = TIMEOUTS) -> float:
    return with_scorer(url, lambda s: s.score(QUESTION, steps), aggregate, timeouts)


def raised(url: str, aggregate: str = "last", timeouts: Timeouts = TIMEOUTS) -> BackendError:
    try:
        score(url, aggregate, timeouts=timeouts)
    except BackendError as exc:
        return exc
    raise AssertionError("no error raised")


def sent_bodies(app: Replay) -> list[Any]:
    return [msgspec.json.decode(r.body) for r in app.requests if (r.method, r.path) == CLASSIFY]


@pytest.fixture
def replay() -> Iterator[Replayed]:
    app = Replay({
        CLASSIFY: Reply(body=fixture("prm_classify_response_last.json")),
        ("GET", "/health"): Reply(body=b"", content_type="text/plain"),
    })
    with serve_asgi(app) as url:
        yield url, app


def serve_prefixes(app: Replay) -> None:
    app.routes[CLASSIFY] = Reply(body=fixture("prm_classify_response_prefixes.json"))


# --- the PRM input: the model card's chat format -----------------------------------------------


def test_prm_input_is_the_chat_rendering_cut_after_the_last_marker() -> None:
    text = prm_input(QUESTION, STEPS)
    assert text == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3*4?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "Multiplication comes before addition, so first compute 3*4 = 12.<extra_0>"
        "Then add 2: 2 + 12 = 14.<extra_0>"
        "The answer is \\boxed{14}.<extra_0>"
    )
    assert SYSTEM_PROMPT.endswith("within \\boxed{}.") and "\\\\" not in SYSTEM_PROMPT  # one real backslash
    # LAST pooling must land on the marker: nothing (no <|im_end|>) after it.
    assert text.endswith(STEP_MARKER) and text.count(STEP_MARKER) == len(STEPS)


def test_marker_text_inside_a_step_or_the_question_is_removed() -> None:
    text = prm_input("Is <extra_0> a token?", ["a <extra_0> b", "c"])
    assert text.count(STEP_MARKER) == 2
    assert "user\nIs  a token?<|im_end|>" in text and "a  b<extra_0>c<extra_0>" in text


def test_steps_from_split_steps_round_trip_into_one_marker_each() -> None:
    branch = "\n\n".join(STEPS) + "\n\n"
    assert prm_input(QUESTION, split_steps(branch)) == prm_input(QUESTION, STEPS)


# --- what the client sends and reads -----------------------------------------------------------


def test_last_sends_the_recorded_request_and_reads_the_reward_at_the_last_marker(replay: Replayed) -> None:
    url, app = replay
    assert score(url) == 0.9716796875
    assert sent_bodies(app) == [msgspec.json.decode(fixture("prm_classify_request_last.json"))]
    assert app.requests[0].path == "/classify"


@pytest.mark.parametrize(("aggregate", "expected"), [
    ("min", min(STEP_REWARDS)),
    ("mean", sum(STEP_REWARDS) / 3),
])
def test_min_and_mean_send_one_prefix_per_step_and_aggregate_them(
    replay: Replayed, aggregate: str, expected: float,
) -> None:
    url, app = replay
    serve_prefixes(app)
    assert score(url, aggregate) == pytest.approx(expected)
    assert sent_bodies(app) == [msgspec.json.decode(fixture("prm_classify_request_prefixes.json"))]
    texts = sent_bodies(app)[0]["text"]
    assert [t.count(STEP_MARKER) for t in texts] == [1, 2, 3]
    assert texts[-1] == msgspec.json.decode(fixture("prm_classify_request_last.json"))["text"]


def test_step_rewards_are_read_in_input_order(replay: Replayed) -> None:
    url, app = replay
    serve_prefixes(app)
    assert with_scorer(url, lambda s: s.step_rewards(QUESTION, STEPS), "min") == STEP_REWARDS


def test_one_step_is_sent_as_a_string_even_for_min(replay: Replayed) -> None:
    # SGLang's warm-up avoids one-element `text` lists for embedding models; a string gets an object back.
    url, app = replay
    assert score(url, "min", steps=STEPS[:1]) == 0.9716796875
    assert isinstance(sent_bodies(app)[0]["text"], str)


@pytest.mark.parametrize("steps", [[], ["", "  \n "]], ids=["none", "blank"])
def test_no_steps_is_neutral_without_a_call(replay: Replayed, steps: list[str]) -> None:
    url, app = replay
    assert score(url, steps=steps) == NEUTRAL_SCORE == 0.5
    assert app.requests == []


def test_one_element_list_answer_is_read_like_an_object(replay: Replayed) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(body=b"[" + fixture("prm_classify_response_last.json") + b"]")
    assert score(url) == 0.9716796875


def test_keep_alive_session_is_lazy_shared_and_closed_by_aclose(replay: Replayed) -> None:
    url, app = replay

    async def main() -> None:
        scorer = SGLangPRMScorer(url, MODEL, TIMEOUTS)
        assert isinstance(scorer, Scorer) and scorer.name == "prm"
        assert not scorer.holds_session  # nothing made before the first call
        assert await scorer.score(QUESTION, []) == 0.5 and not scorer.holds_session
        values = await asyncio.gather(*(scorer.score(QUESTION, STEPS) for _ in range(8)))
        assert values == [0.9716796875] * 8 and scorer.holds_session
        session = scorer.session  # the one it holds: `session` makes one only when none is open
        await scorer.score(QUESTION, STEPS)
        assert scorer.session is session
        await scorer.aclose()
        assert session.closed and not scorer.holds_session
        await scorer.aclose()  # idempotent

    asyncio.run(main())
    assert len(app.requests) == 9


def test_health_reads_sglang_health(replay: Replayed) -> None:
    url, app = replay
    assert with_scorer(url, lambda s: s.health()) is True
    app.routes[("GET", "/health")] = Reply(status=503, body=b"", content_type="text/plain")
    assert with_scorer(url, lambda s: s.health()) is False
    assert with_scorer(dead_url(), lambda s: s.health()) is False


def test_api_key_is_sent_as_bearer() -> None:
    app = Replay({CLASSIFY: Reply(body=fixture("prm_classify_response_last.json"))})
    headers: list[dict[bytes, bytes]] = []

    async def spy(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers.append(dict(scope["headers"]))
        await app(scope, receive, send)

    async def main(url: str) -> float:
        scorer = SGLangPRMScorer.from_config(PRMScorerConfig(url=url, model=MODEL, api_key="sk-prm"))
        try:
            return await scorer.score(QUESTION, STEPS)
        finally:
            await scorer.aclose()

    with serve_asgi(spy) as url:
        assert asyncio.run(main(url)) == 0.9716796875
    assert headers[0][b"authorization"] == b"Bearer sk-prm"
    assert headers[0][b"content-type"] == b"application/json"


def test_credentials_in_the_url_are_sent_as_basic_auth_and_never_shown(replay: Replayed) -> None:
    url, app = replay
    assert score(url.replace("http://", "http://prm:s3cret@")) == 0.9716796875
    assert app.requests[-1].headers["authorization"] == "Basic cHJtOnMzY3JldA=="  # prm:s3cret
    error = raised(dead_url().replace("http://", "http://prm:s3cret@"))
    assert "s3cret" not in error.message and "prm:" not in error.message


# --- errors: always a BackendError, never a hang -----------------------------------------------


def test_connection_refused_is_backend_unavailable_quickly_naming_the_prm_not_its_url() -> None:
    url = dead_url()
    start = time.monotonic()
    error = raised(url)
    assert time.monotonic() - start < 1.5
    assert isinstance(error, BackendUnavailable) and error.backend == "prm"
    assert "`prm`" in error.message and url not in error.message  # the message may reach a client's error body


def test_500_is_backend_failed(replay: Replayed) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(status=500, body=b'{"object":"error","message":"boom","type":"InternalServerError",'
                                               b'"param":null,"code":500}')
    error = raised(url)
    assert isinstance(error, BackendFailed) and "HTTP 500" in error.message and "boom" in error.message
    assert url not in error.message


@pytest.mark.parametrize("name", ["classify_error_400_not_embedding.json", "classify_error_400_context_length.json"])
def test_recorded_400s_are_the_prms_fault_not_the_clients(replay: Replayed, name: str) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(status=400, body=fixture(name))
    error = raised(url)
    assert isinstance(error, BackendFailed)
    assert msgspec.json.decode(fixture(name))["error"]["message"] in error.message


@pytest.mark.parametrize("status", [429, 503])
def test_overloaded_or_warming_up_is_backend_unavailable(replay: Replayed, status: int) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(status=status, body=b"", content_type="text/plain")
    assert isinstance(raised(url), BackendUnavailable)


def test_no_classify_route_is_backend_failed(replay: Replayed) -> None:
    url, app = replay
    del app.routes[CLASSIFY]  # Replay answers 404 {"detail":"Not Found"}, as FastAPI does
    error = raised(url)
    assert isinstance(error, BackendFailed) and "HTTP 404" in error.message and "Not Found" in error.message


@pytest.mark.parametrize("body", [
    b'{"embedding":[0.97',  # truncated
    b"not json",
    b"",
    b'{"meta_info":{}}',  # no embedding
    b'{"embedding":"0.97"}',
    b"null",
], ids=["truncated", "text", "empty", "no-embedding", "string", "null"])
def test_malformed_json_is_backend_failed(replay: Replayed, body: bytes) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(body=body)
    error = raised(url)
    assert isinstance(error, BackendFailed) and "unreadable" in error.message


@pytest.mark.parametrize("embedding", [[2.3125], [-0.4], [0.2, 0.8], []],
                         ids=["orm-scalar", "negative", "two-values", "empty"])
def test_anything_but_one_probability_is_refused(replay: Replayed, embedding: list[float]) -> None:
    # e.g. an outcome RM (Qwen2ForRewardModel: one unbounded scalar) or an embedding model behind the URL
    url, app = replay
    recorded = msgspec.json.decode(fixture("prm_classify_response_last.json"))
    app.routes[CLASSIFY] = Reply(body=msgspec.json.encode({**recorded, "embedding": embedding}))
    error = raised(url)
    assert isinstance(error, BackendFailed) and "P(positive)" in error.message


def test_sequence_classification_shape_is_refused(replay: Replayed) -> None:
    # /v1/classify's response shape served on /classify: not what SGLang's /classify sends
    url, app = replay
    app.routes[CLASSIFY] = Reply(body=fixture("v1_classify_response.json"))
    assert isinstance(raised(url), BackendFailed)


def test_fewer_outputs_than_prefixes_is_backend_failed(replay: Replayed) -> None:
    url, app = replay
    two = msgspec.json.decode(fixture("prm_classify_response_prefixes.json"))[:2]
    app.routes[CLASSIFY] = Reply(body=msgspec.json.encode(two))
    error = raised(url, "min")
    assert isinstance(error, BackendFailed) and "2 outputs for 3 inputs" in error.message


@pytest.mark.parametrize("body", [b"", b'{"embedding":[0.9'], ids=["no-body", "half-body"])
def test_stalled_server_is_a_timeout_within_the_configured_deadline(replay: Replayed, body: bytes) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(body=body, stall=True)
    start = time.monotonic()
    error = raised(url, timeouts=Timeouts(connect_s=1.0, read_s=0.3, total_s=10.0))
    elapsed = time.monotonic() - start
    assert isinstance(error, BackendTimeout) and url not in error.message
    assert 0.25 < elapsed < 1.5


def test_total_bounds_the_call_when_shorter_than_read(replay: Replayed) -> None:
    url, app = replay
    app.routes[CLASSIFY] = Reply(body=b"", stall=True)
    start = time.monotonic()
    error = raised(url, timeouts=Timeouts(connect_s=1.0, read_s=30.0, total_s=0.3))
    assert isinstance(error, BackendTimeout) and time.monotonic() - start < 1.5


# --- config ------------------------------------------------------------------------------------


def test_config_decodes_with_defaults_and_forbids_unknown_fields() -> None:
    config = msgspec.convert({"url": "http://127.0.0.1:30001", "model": MODEL}, PRMScorerConfig)
    assert (config.aggregate, config.timeouts, config.api_key) == ("last", DEFAULT_PRM_TIMEOUTS, "")
    full = msgspec.toml.decode(
        b'url = "http://prm:30000/"\nmodel = "m"\naggregate = "min"\n[timeouts]\nread_s = 2.5\n', type=PRMScorerConfig)
    scorer = SGLangPRMScorer.from_config(full, name="math-prm")
    assert (scorer.url, scorer.endpoint, scorer.aggregate, scorer.name) == (
        "http://prm:30000", "http://prm:30000/classify", "min", "math-prm")
    assert scorer.deadline_s == 2.5
    with pytest.raises(msgspec.ValidationError, match="unknown field `agregate`"):
        msgspec.convert({"url": "u", "model": "m", "agregate": "min"}, PRMScorerConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"url": "u", "model": "m", "aggregate": "max"}, PRMScorerConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"url": "u", "model": "m", "timeouts": {"read": 1}}, PRMScorerConfig)


def test_unknown_aggregate_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="aggregate"):
        SGLangPRMScorer("http://127.0.0.1:1", MODEL, aggregate="product")
