"""The picker and `cascade serve` make one decision: the same config loads the same learned router, and each
prompt and hint gets the same tier and the same assessment from both."""

from __future__ import annotations

import asyncio
import http.client
import json
from pathlib import Path

from cascade.config import decode_config
from cascade.extproc.picker import Routed, TierPicker
from cascade.gateway.server import Gateway
from cascade.service.bodies import decode_chat_request
from cascade.testing.servers import ladder_toml
from tests.gateway.gateway_setup import running_gateway, user
from tests.learned_router import EASY, HARD


def test_the_learned_router_decides_as_in_the_gateway(router_dir: Path) -> None:
    learned = f'[routing]\npolicy = "learned"\nrouter = "{router_dir}"\n'
    config = decode_config(ladder_toml("http://127.0.0.1:9", learned))
    picker, gateway = TierPicker(config), Gateway(config)
    tiers = set()
    for text in (EASY, HARD):
        for quality in ("fast", "balanced", "best", 0.5, 0.95):
            body = {"model": "cascade", "quality": quality, "messages": [{"role": "user", "content": text}]}
            verdict = asyncio.run(picker.pick({":path": "/v1/chat/completions", ":method": "POST"},
                                              json.dumps(body).encode()))
            assert isinstance(verdict, Routed)
            expected = asyncio.run(gateway.service.route(decode_chat_request(json.dumps(body).encode())))
            assert verdict.decision == expected and verdict.decision.router == "learned"
            tiers.add(verdict.tier)
    assert len(tiers) > 1  # the prompts and hints reach more than one tier


def test_the_random_split_decides_as_in_the_gateway() -> None:
    split = '[routing]\npolicy = "random"\n[routing.random]\nseed = 4\naccuracies = [0.3, 0.55, 0.8]\n'
    config = decode_config(ladder_toml("http://127.0.0.1:9", split))
    picker, gateway = TierPicker(config), Gateway(config)
    tiers = set()
    for i in range(12):
        for quality in ("balanced", 0.5, 0.7):
            body = {"model": "cascade", "quality": quality, "messages": [{"role": "user", "content": f"Question {i}"}]}
            verdict = asyncio.run(picker.pick({":path": "/v1/chat/completions", ":method": "POST"},
                                              json.dumps(body).encode()))
            assert isinstance(verdict, Routed)
            expected = asyncio.run(gateway.service.route(decode_chat_request(json.dumps(body).encode())))
            assert verdict.decision == expected and verdict.decision.router == "random"
            tiers.add(verdict.tier)
    assert len(tiers) == 3  # every tier is reached


# Spellings of a path, and whether each is the chat path (cascade/service/paths.py).
SPELLINGS = [
    ("/v1/chat/completions", True), ("/v1/chat/completions?x=1", True), ("/v1/chat/%63ompletions", True),
    ("/v1/%63hat/%63%6F%6Dpletions", True), ("//v1//chat/completions", True), ("/v1/chat/./completions", True),
    ("/v1/x/../chat/completions", True), ("/v1/chat/%2e/completions", True), ("/../v1/chat/completions", True),
    ("/v1/chat%2Fcompletions", False), ("/v1/chat%2fcompletions", False), ("/v1/chat%5Ccompletions", False),
    ("/v1/chat/completions/", False), ("/V1/chat/completions", False), ("/v1/chat/completions%00", False),
    ("/v1/chat/completions%20", False), ("/v1/chat/completion%73x", False), ("/v1/chat/completions/..", False),
]


def test_the_picker_decides_exactly_the_paths_the_gateway_serves_as_chat() -> None:
    body = json.dumps({"model": "tier-small", "messages": user()}).encode()
    with running_gateway() as (url, _, _):
        picker = TierPicker(decode_config(ladder_toml("http://127.0.0.1:9")))
        answers = {}
        for path, chat in SPELLINGS:
            connection = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
            try:  # http.client sends the path as it is written (httpx would normalise it first)
                connection.request("POST", path, body, {"content-type": "application/json"})
                reply = connection.getresponse()
                status, text = reply.status, reply.read()
            finally:
                connection.close()
            served = status == 200 and "choices" in json.loads(text)
            decided = asyncio.run(picker.pick({":path": path, ":method": "POST"}, body)) is not None
            assert (served, decided) == (chat, chat), (path, status, text[:200])
            answers[path] = status, text
    for path in ("/v1/chat%2Fcompletions", "/v1/chat%5Ccompletions"):  # no normal form: the gateway refuses it
        status, text = answers[path]
        assert status == 400 and json.loads(text)["error"]["code"] == "invalid_path"
