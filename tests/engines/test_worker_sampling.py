"""How an embedded worker decodes: transformers serve's continuous batching applies one generation config to
every request (its first request's), so a worker set to sample sends its generation config at start-up and
with every request (after a restart a user's request may come first), a greedy one sends none, and a tier on
a greedy worker refuses requests for branches. The engine here is the fake engine over real HTTP; the
real engine's behaviour is checked in tests/e2e/test_worker_sampling_e2e.py."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cascade.config import Limits, decode_config
from cascade.engines.supervisor import Supervisor, Worker, sampling_fields
from cascade.errors import InvalidRequest
from cascade.schemas import BranchOverride, ChatCompletionRequest, ChatMessage
from cascade.service.validation import branches_for
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.tiers.answer import answer
from cascade.tiers.build import build_tiers
from cascade.tiers.upstream import Sampling

IDLE = [sys.executable, "-c", "import time; time.sleep(60)"]  # the process; HTTP is the fake engine


def ladder(port: int) -> str:
    return f"""
[[workers]]
name = "greedy"
model = "smollm2-135m"
port = {port}

[[workers]]
name = "sampling"
model = "smollm2-135m"
port = {port}
temperature = 0.9
top_p = 0.95

[[tiers]]
name = "direct"
backends = [{{ kind = "worker", worker = "greedy" }}]

[[tiers]]
name = "thinker"
branches = {{ n = 2, temperature = 0.9 }}
scorer = "none"
backends = [{{ kind = "worker", worker = "sampling" }}]
"""


def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "pad_token_id": 2}))
    return folder


def test_the_generation_config_is_the_models_own_with_sampling_on(tmp_path) -> None:
    config = decode_config(ladder(1)).workers[1]
    fields = sampling_fields(model_dir(tmp_path), config)
    assert (fields["temperature"], fields["top_p"]) == (0.9, 0.95)  # over any request's own
    sent = json.loads(str(fields["generation_config"]))
    assert sent == {"eos_token_id": 2, "pad_token_id": 2, "do_sample": True, "temperature": 0.9, "top_p": 0.95}
    assert json.loads(str(sampling_fields(tmp_path / "no-model", config)["generation_config"]))["do_sample"] is True


def test_a_sampling_worker_sends_its_generation_config_at_start_up_and_with_every_request(tmp_path) -> None:
    from cascade.testing.asgi import serve_asgi

    bodies: list[dict[str, Any]] = []

    def record(script: FakeScript, body: dict[str, Any]) -> FakeScript:
        bodies.append(body)
        return script

    with serve_asgi(FakeEngine(FakeScript(tokens=3), hook=record)) as url:
        config = decode_config(ladder(int(url.rsplit(":", 1)[1])))
        workers = {w.name: Worker(w, model_dir(tmp_path), tmp_path, command=IDLE, first_generation=True)
                   for w in config.workers}
        tiers = {t.name: t for t in build_tiers(config, workers)}

        async def run() -> None:
            supervisor = Supervisor(list(workers.values()))
            await supervisor.start()
            try:
                started = len(bodies)
                assert started == 2  # one first generation per worker
                for name in ("direct", "thinker"):
                    await answer(tiers[name], [ChatMessage(role="user", content="hi")],
                                 Sampling(max_tokens=3, temperature=0.0))
            finally:
                for tier in tiers.values():
                    await tier.backend.aclose()
                supervisor.stop()

        asyncio.run(run())
    first_greedy, first_sampling, direct, thinker = bodies
    assert "generation_config" not in first_greedy and "generation_config" not in direct
    assert direct["temperature"] == 0.0
    for body in (first_sampling, thinker):
        assert json.loads(body["generation_config"])["do_sample"] is True
        assert body["temperature"] == 0.9  # the worker's, not the request's 0
    assert tiers["direct"].greedy_only and not tiers["thinker"].greedy_only


def test_branches_on_a_greedy_workers_tier_are_refused_with_the_parameter_named(tmp_path) -> None:
    config = decode_config(ladder(1))
    workers = {w.name: Worker(w, model_dir(tmp_path), tmp_path, command=IDLE) for w in config.workers}
    direct, thinker = build_tiers(config, workers)
    req = ChatCompletionRequest(model="direct", messages=[ChatMessage(role="user", content="hi")],
                                branches=BranchOverride(n=3))
    with pytest.raises(InvalidRequest, match="decodes every request greedily") as info:
        branches_for(req, direct, Limits())
    assert info.value.param == "branches.n"
    settings = branches_for(req, thinker, Limits())
    assert settings is not None and settings.n == 3
