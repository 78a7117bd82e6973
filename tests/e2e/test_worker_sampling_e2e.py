"""The real engine (transformers serve, continuous batching, SmolLM2) decodes every request with one generation
config: a greedy worker ignores a request's temperature, a worker set to sample samples every request, and a
sampling worker whose first request was a user's (as after a restart) still samples, because cascade sends
the config with every request. Before this, the embedded reasoning tier's "sampled" branches were greedy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from cascade.config import decode_config
from cascade.engines.models import load_card, prepare
from cascade.engines.supervisor import Supervisor, Worker
from cascade.schemas import ChatMessage
from cascade.tiers.answer import answer
from cascade.tiers.build import build_tiers
from cascade.tiers.upstream import Sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPT = "Write a list of ten random animals."
LADDER = """
[[workers]]
name = "greedy"
model = "smollm2-135m"

[[workers]]
name = "sampling"
model = "smollm2-135m"
temperature = 1.0

[[workers]]
name = "restarted"
model = "smollm2-135m"
temperature = 1.0

[[tiers]]
name = "direct"
backends = [{ kind = "worker", worker = "greedy" }]

[[tiers]]
name = "restarted"
backends = [{ kind = "worker", worker = "restarted" }]
"""


def test_a_worker_decodes_every_request_as_it_is_set_whatever_the_request_asks(tmp_path: Path) -> None:
    config = decode_config(LADDER)
    folder = prepare(load_card("smollm2-135m"))
    # "restarted" skips cascade's start-up generation: its first request is one of the tier's own.
    workers = {w.name: Worker(w, folder, tmp_path, first_generation=w.name != "restarted") for w in config.workers}
    tiers = {t.name: t for t in build_tiers(config, workers)}

    async def raw(worker: Worker, seed: int) -> str:
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            response = await client.post(f"{worker.url}/v1/chat/completions", json={
                "model": str(folder), "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 20,
                "temperature": 1.5, "seed": seed})
        response.raise_for_status()
        return str(response.json()["choices"][0]["message"]["content"])

    async def through_tier(seed: int) -> str:
        whole = await answer(tiers["restarted"], [ChatMessage(role="user", content=PROMPT)],
                             Sampling(max_tokens=20, temperature=0.0, seed=seed))
        return whole.results[0].text

    async def run() -> tuple[list[str], list[str], list[str]]:
        supervisor = Supervisor(list(workers.values()))
        await supervisor.start()
        try:
            greedy = [await raw(workers["greedy"], s) for s in range(3)]
            sampled = [await raw(workers["sampling"], s) for s in range(3)]
            restarted = [await through_tier(s) for s in range(3)]
        finally:
            for tier in tiers.values():
                await tier.backend.aclose()
            supervisor.stop()
        return greedy, sampled, restarted

    greedy, sampled, restarted = asyncio.run(run())
    assert len(set(greedy)) == 1, greedy  # temperature 1.5 and three seeds asked: one greedy text
    assert len(set(sampled)) > 1, sampled  # no sampling fields sent: sampled anyway, as the worker is set
    assert len(set(restarted)) > 1, restarted  # temperature 0 asked, first request a user's: still sampled
