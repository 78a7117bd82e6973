"""The picker and `cascade serve` make one decision: the same config loads the same learned router, and each
prompt and hint gets the same tier and the same assessment from both."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cascade.config import decode_config
from cascade.extproc.picker import Routed, TierPicker
from cascade.gateway.server import Gateway
from cascade.service.bodies import decode_chat_request
from cascade.testing.servers import ladder_toml
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
