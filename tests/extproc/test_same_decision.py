"""The picker and `cascade serve` make one decision: the same config loads the same learned router, and each
prompt and hint gets the same tier and the same assessment from both."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from cascade.cli import main
from cascade.config import decode_config
from cascade.extproc.picker import Routed, TierPicker
from cascade.gateway.app import decode_chat_request
from cascade.gateway.server import Gateway
from cascade.testing import TIERS, ladder_toml

EASY = "Sam buys 3 apples for $2 each. How much does he pay in total?"
HARD = ". ".join(f"Sam buys {k + 11} apples for ${k + 2} each" for k in range(6)) + ". How much does he pay in total?"


@pytest.fixture(scope="module")
def router_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-tier router trained on seeded outcomes where long, number-heavy prompts defeat cheap tiers."""
    rng = np.random.default_rng(0)
    rows = ["prompt," + ",".join(TIERS)]
    for _ in range(300):
        k = int(rng.integers(1, 7))
        prompt = ". ".join(f"Sam buys {int(rng.integers(2, 99))} apples for ${int(rng.integers(1, 9))} each"
                           for _ in range(k)) + ". How much does he pay in total?"
        ok = [rng.random() < 1.0 - 0.16 * k, rng.random() < 1.0 - 0.08 * k, rng.random() < 0.98 - 0.02 * k]
        rows.append(f'"{prompt}",' + ",".join(str(v) for v in ok))
    tmp = tmp_path_factory.mktemp("learned")
    (tmp / "outcomes.csv").write_text("\n".join(rows) + "\n")
    out = tmp / "router"
    assert main(["router", "train", "--outcomes", str(tmp / "outcomes.csv"), "--tiers", ",".join(TIERS),
                 "--out", str(out), "--cv-folds", "3"]) == 0
    return out


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
            expected = gateway.service.route(decode_chat_request(json.dumps(body).encode()))
            assert verdict.decision == expected and verdict.decision.router == "learned"
            tiers.add(verdict.tier)
    assert len(tiers) > 1  # the prompts and hints reach more than one tier
