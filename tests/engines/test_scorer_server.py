"""`cascade scorer-server`'s HTTP side (cascade/engines/scorer_server.py) over real HTTP on 127.0.0.1, with a
model-free verifier: cascade's PRM client scores with it unchanged, a bad body gets a 400 error object, and a
tier's `scorer = { worker = ... }` becomes that client at the scorer worker's URL. The real model: tests/e2e/
test_verifier_scorer_e2e.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import msgspec
import pytest

from cascade.branches.prm_client import SGLangPRMScorer, prm_input
from cascade.branches.verifier import Scored
from cascade.config import PRMScorerConfig, Timeouts, decode_config
from cascade.engines.scorer_server import ScorerApp, scorer_command
from cascade.engines.supervisor import Worker
from cascade.errors import BackendFailed, ConfigError
from cascade.testing.asgi import serve_asgi
from cascade.tiers.build import make_scorer, workers_of

TIMEOUTS = Timeouts(connect_s=1.0, read_s=5.0, total_s=10.0)
QUESTION = "Tom has 12 apples and buys 7 more. How many apples does he have?"
STEPS = ["He buys 7 more: 12 + 7 = 19.", "The answer is 19."]


class CountingVerifier:
    """Scores a (question, steps) by how many steps it has: 1 - 1 / (steps + 1). Records its calls."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def encode(self, question: str, steps: list[str]) -> list[int]:
        if "too long" in question:
            raise ValueError("The input (99999 tokens) is longer than the model's context length (8192 tokens).")
        return [len(question), *[len(s) for s in steps]]

    def score_ids(self, inputs: list[list[int]]) -> list[Scored]:
        self.calls.append(inputs)
        return [Scored(score=1 - 1 / len(ids), prompt_tokens=len(ids)) for ids in inputs]


def score(url: str, steps: list[str], aggregate: str = "last", question: str = QUESTION) -> float:
    async def main() -> float:
        scorer = SGLangPRMScorer(url, "verifier", TIMEOUTS, aggregate=aggregate)
        try:
            return await scorer.score(question, steps)
        finally:
            await scorer.aclose()

    return asyncio.run(main())


def test_the_prm_client_scores_with_the_scorer_server_unchanged() -> None:
    verifier = CountingVerifier()
    with serve_asgi(ScorerApp(verifier, "/models/m")) as url:
        last = score(url, STEPS)
        prefixes = score(url, STEPS, aggregate="min")
        health = httpx.get(f"{url}/health")
        info = httpx.get(f"{url}/get_model_info").json()
    assert last == pytest.approx(1 - 1 / 3) and prefixes == pytest.approx(1 - 1 / 2)
    # One string: one input; min over prefixes: one list, scored in one call, in order.
    assert verifier.calls == [[[len(QUESTION), *map(len, STEPS)]], [[len(QUESTION), len(STEPS[0])],
                                                                     [len(QUESTION), *map(len, STEPS)]]]
    assert health.status_code == 200 and info == {"model_path": "/models/m", "is_generation": False}


def test_an_answer_has_sglangs_shape_one_object_per_input_in_order() -> None:
    text = prm_input(QUESTION, STEPS)
    with serve_asgi(ScorerApp(CountingVerifier())) as url:
        one = httpx.post(f"{url}/classify", json={"model": "m", "text": text}).json()
        many = httpx.post(f"{url}/encode", json={"text": [text, prm_input(QUESTION, STEPS[:1])]}).json()
    assert one["embedding"] == [pytest.approx(2 / 3)] and one["meta_info"]["prompt_tokens"] == 3
    assert [m["embedding"] for m in many] == [[pytest.approx(2 / 3)], [pytest.approx(1 / 2)]]


@pytest.mark.parametrize(("body", "why"), [
    (b"not json", "expected a JSON object"),
    (b'{"input": "x"}', "`text`"),
    (b'{"text": 5}', "`text`"),
    (b'{"text": []}', "empty list"),
    (b'{"text": "What is 2 + 2?"}', "not a PRM input"),
    (msgspec.json.encode({"text": prm_input("too long " + QUESTION, STEPS)}), "context length"),
])
def test_a_bad_body_is_a_400_with_an_error_object(body: bytes, why: str) -> None:
    verifier = CountingVerifier()
    with serve_asgi(ScorerApp(verifier)) as url:
        response = httpx.post(f"{url}/classify", content=body)
    error = response.json()["error"]
    assert response.status_code == 400 and why in error["message"] and error["code"] == 400
    assert verifier.calls == []


def test_the_prm_client_reads_a_refused_input_as_a_backend_fault() -> None:
    with serve_asgi(ScorerApp(CountingVerifier())) as url, pytest.raises(BackendFailed, match="context length"):
        score(url, STEPS, question="too long")


def test_unknown_routes_and_methods_are_refused() -> None:
    with serve_asgi(ScorerApp(CountingVerifier())) as url:
        assert httpx.get(f"{url}/classify").status_code == 405
        assert httpx.post(f"{url}/v1/chat/completions", json={}).status_code == 404


BASE = """
[[workers]]
name = "judge"
model = "smollm2-135m"
role = "scorer"
threads = 2

[[tiers]]
name = "reason"
branches = { n = 4 }
backends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]
"""


def test_a_tier_scores_with_its_scorer_worker_through_the_prm_client(tmp_path: Path) -> None:
    config = decode_config(BASE + 'scorer = { worker = "judge" }\n')
    assert workers_of(config, ["reason"]) == {"judge"}  # started for the tier, as its backends' workers are
    # Not started: the scorer only needs its URL (make_workers gives a scorer worker a free port).
    worker = Worker(msgspec.structs.replace(config.workers[0], port=30999), tmp_path, tmp_path, command=["true"])
    scorer = make_scorer(config.tiers[0], {"judge": worker})
    assert isinstance(scorer, SGLangPRMScorer) and scorer.url == "http://127.0.0.1:30999"
    with pytest.raises(ConfigError, match="not running"):
        make_scorer(config.tiers[0], {})


def test_a_scorer_worker_runs_cascade_scorer_server_on_loopback() -> None:
    command = scorer_command(Path("/models/judge"), 30123, threads=2)
    assert command[:3] == [sys.executable, "-m", "cascade.cli"] and command[3] == "scorer-server"
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "30123"
    assert command[command.index("--threads") + 1] == "2"


@pytest.mark.parametrize(("extra", "why"), [
    ('scorer = { worker = "judge", url = "http://127.0.0.1:2" }\n', "not both"),
    ("scorer = { }\n", "not neither"),
    ('scorer = { worker = "nobody" }\n', "not a [[workers]] entry with role"),
    ('scorer = { url = "127.0.0.1:2" }\n', "must start with http"),
])
def test_a_bad_scorer_table_names_the_key(extra: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.scorer") as info:
        decode_config(BASE + extra)
    assert why in info.value.message


def test_a_chat_worker_is_no_scorer_and_a_scorer_worker_no_backend() -> None:
    chat = BASE.replace('role = "scorer"', 'role = "chat"')
    with pytest.raises(ConfigError, match=r"not a \[\[workers\]\] entry with role"):
        decode_config(chat + 'scorer = { worker = "judge" }\n')
    backend = BASE.replace('{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }',
                           '{ kind = "worker", worker = "judge" }')
    with pytest.raises(ConfigError, match="a scorer worker: it answers no chat"):
        decode_config(backend)


def test_the_example_config_prunes_its_reasoning_tier_with_a_verifier_worker() -> None:
    from cascade.config import load_config

    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "embedded-verifier.toml")
    tier = config.tiers[-1]
    assert tier.scorer == PRMScorerConfig(worker="judge") and tier.branches.n > 1
    assert workers_of(config, [tier.name]) == {"qwen-sampling", "judge"}
