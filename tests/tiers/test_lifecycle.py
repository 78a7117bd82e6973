"""The tiers' lifecycle (cascade/tiers/lifecycle.py): however the block exits (success, an exception, a
cancellation), every tier's backend and scorer is closed and every worker stopped. Workers are idle processes whose HTTP is the fake engine
over real HTTP on 127.0.0.1; "closed" is what the engine's side sees: no connection from this process stays open."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import msgspec
import pytest

from cascade.cli import main
from cascade.config import decode_config
from cascade.engines.supervisor import Worker, free_port
from cascade.errors import ConfigError
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.waiting import eventually
from cascade.tiers.lifecycle import TierFleet, running_tiers
from tests.servers import Replay, Reply

IDLE = [sys.executable, "-c", "import time; time.sleep(60)"]  # the worker's process; HTTP is the fake engine
PRM_REPLY = (Path(__file__).parents[1] / "fixtures" / "sglang" / "prm_classify_response_last.json").read_bytes()


def ladder_toml(engine_port: int, prm_url: str) -> str:
    """Two tiers: `small` on an embedded worker (its HTTP: the fake engine), `thinker` on the engine directly,
    with branches scored by a PRM (`prm_url`)."""
    return f"""
[[workers]]
name = "w"
model = "smollm2-135m"
port = {engine_port}

[[tiers]]
name = "small"
default_max_tokens = 32
scorer = "none"
backends = [{{ kind = "worker", worker = "w" }}]

[[tiers]]
name = "thinker"
default_max_tokens = 32
branches = {{ n = 2, m = 2, k = 1 }}
scorer = {{ url = "{prm_url}", model = "prm" }}
backends = [{{ kind = "openai", url = "http://127.0.0.1:{engine_port}", model = "fake-big" }}]
"""


def open_connections(*urls: str) -> int:
    """TCP connections established to the servers at `urls` (their client side: this process's, as nothing else
    knows these ports), from /proc/net/tcp."""
    ports = {int(url.rsplit(":", 1)[1]) for url in urls}
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for row in rows if int(row[2].rsplit(":", 1)[1], 16) in ports and row[3] == "01")  # ESTABLISHED


class Boom(Exception):
    pass


@pytest.mark.parametrize("exit_by", ["success", "exception", "cancellation"])
def test_every_backend_scorer_and_worker_is_closed_however_the_block_exits(tmp_path, exit_by: str) -> None:
    prm = Replay({("GET", "/health"): Reply(body=b"")})
    with serve_asgi(FakeEngine(FakeScript(tokens=4))) as engine_url, serve_asgi(prm) as prm_url:
        config = decode_config(ladder_toml(int(engine_url.rsplit(":", 1)[1]), prm_url))
        workers = {w.name: Worker(w, tmp_path, tmp_path, command=IDLE) for w in config.workers}
        seen: list[TierFleet] = []

        async def use() -> None:
            async with running_tiers(config, workers=workers) as fleet:
                seen.append(fleet)
                assert [w.alive() for w in fleet.workers.values()] == [True]
                # Keep-alive connections to every backend and the scorer, as serving leaves them.
                for tier in fleet.tiers:
                    assert await tier.backend.health()
                    if tier.scorer is not None:
                        assert await tier.scorer.health()
                assert open_connections(engine_url, prm_url) >= 3
                if exit_by == "exception":
                    raise Boom
                if exit_by == "cancellation":
                    await asyncio.sleep(3600)

        async def run() -> None:
            if exit_by != "cancellation":
                await use()
                return
            task = asyncio.create_task(use())
            assert await asyncio.to_thread(eventually, lambda: bool(seen) and open_connections(engine_url, prm_url)
                                           >= 3, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        if exit_by == "exception":
            with pytest.raises(Boom):
                asyncio.run(run())
        else:
            asyncio.run(run())
        assert eventually(lambda: open_connections(engine_url, prm_url) == 0)
        [fleet] = seen
        assert not any(w.alive() for w in fleet.workers.values())
        assert fleet.supervisor.workers and all(w.process and w.process.returncode is not None
                                                 for w in fleet.supervisor.workers)


def test_a_start_that_fails_stops_the_workers_already_started(tmp_path) -> None:
    config = decode_config(ladder_toml(free_port(), "http://127.0.0.1:2"))  # nothing answers there
    dies = Worker(config.workers[0], tmp_path, tmp_path, command=[sys.executable, "-c", "raise SystemExit(3)"])
    waits = Worker(msgspec.structs.replace(config.workers[0], name="waits"), tmp_path, tmp_path, command=IDLE)

    async def run() -> None:
        async with running_tiers(config, workers={"w": dies, "waits": waits}):
            raise AssertionError("the block must not run")

    with pytest.raises(ConfigError, match="`w` exited while starting"):
        asyncio.run(run())
    assert waits.process is not None and not waits.alive()


def test_only_the_selected_tiers_are_built_and_only_their_workers_made(tmp_path) -> None:
    config = decode_config(ladder_toml(1, "http://127.0.0.1:2"))
    fleet = TierFleet(config, ["thinker"], log_dir=tmp_path)
    assert [t.name for t in fleet.tiers] == ["thinker"] and fleet.tiers[0].index == 1
    assert fleet.workers == {}  # the thinker runs on no worker: none is prepared or started
    asyncio.run(fleet.aclose())
    asyncio.run(fleet.aclose())  # idempotent


def test_label_closes_its_scorers(tmp_path) -> None:
    # `cascade label` used to close its backends but never its scorers: the PRM's keep-alive connection stayed open.
    prm = Replay({("POST", "/classify"): Reply(body=PRM_REPLY)})
    answer = "3_*_6_=_18.|####_18"
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as engine_url, serve_asgi(prm) as prm_url:
        toml = ladder_toml(int(engine_url.rsplit(":", 1)[1]), prm_url)
        (tmp_path / "cascade.toml").write_text(toml[toml.index("[[tiers]]\nname = \"thinker\""):])
        rows = [{"id": f"q{i}", "prompt": f"Q{i} [fake answer={answer}]", "reference": "#### 18"} for i in range(2)]
        (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        out = tmp_path / "outcomes.jsonl"
        assert main(["label", "--config", str(tmp_path / "cascade.toml"), "--dataset", str(tmp_path / "q.jsonl"),
                     "--out", str(out)]) == 0
        assert prm.requests, "the scorer was never used: the test would prove nothing"
        assert len(out.read_text().splitlines()) == 2
        assert eventually(lambda: open_connections(prm_url, engine_url) == 0)
