"""Which tier each `cascade bench branches` method runs on and how it decodes: vanilla greedy on the greedy tier of
the same model when the tier's embedded worker samples (the engine decodes as its worker is set, whatever the
request asks), branched methods refused on a greedy worker's tier, never a temperature that was not used. The
engine is the fake engine over real HTTP, behind workers whose process is an idle one (cascade/bench/targets.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from cascade.bench.methods import BenchSettings, arrival_offsets
from cascade.bench.runs import BenchRun, run_benchmark
from cascade.bench.targets import BenchTargets, bench_targets
from cascade.cli import main
from cascade.config import decode_config
from cascade.engines.supervisor import Worker
from cascade.errors import ConfigError
from cascade.label import select_prompts
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.tiers.build import workers_of
from tests.test_bench import write_inputs

IDLE = [sys.executable, "-c", "import time; time.sleep(60)"]  # the worker's process; HTTP is the fake engine
GREEDY = """
[[workers]]
name = "qwen"
model = "qwen2.5-coder-0.5b"
port = {port}

[[tiers]]
name = "direct"
system_prompt = "{prompt}"
backends = [{{ kind = "worker", worker = "qwen" }}]
"""
SAMPLING = """
[[workers]]
name = "qwen-sampling"
model = "qwen2.5-coder-0.5b"
port = {port}
temperature = 0.7
top_p = 0.95

[[tiers]]
name = "reason"
branches = {{ n = 2 }}
scorer = "none"
backends = [{{ kind = "worker", worker = "qwen-sampling" }}]
"""


def ladder(port: int = 1, greedy: bool = True, prompt: str = "") -> str:
    return (GREEDY.format(port=port, prompt=prompt) if greedy else "") + SAMPLING.format(port=port)


def refusal(tmp_path: Path, capsys, toml: str, *extra: str) -> str:
    """The one line `cascade bench branches` exits 2 with on this config (nothing is started)."""
    (tmp_path / "cascade.toml").write_text(toml)
    assert main(["bench", "branches", "--config", str(tmp_path / "cascade.toml"), *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_vanilla_on_a_sampling_workers_tier_decodes_greedily_on_the_greedy_tier_of_its_model(tmp_path) -> None:
    bodies: list[dict[str, Any]] = []

    def record(script: FakeScript, body: dict[str, Any]) -> FakeScript:
        bodies.append(body)
        return script

    started: list[str] = []
    with serve_asgi(FakeEngine(FakeScript(tokens=4), hook=record)) as url:
        write_inputs(tmp_path, url)  # the questions
        config = decode_config(ladder(int(url.rsplit(":", 1)[1])))
        targets = bench_targets(config, "reason", vanilla=True, branched=True)
        assert targets == BenchTargets(tier="reason", vanilla_tier="direct", temperature=0.7, top_p=0.95)
        settings = BenchSettings(n=2, m=1, rate=50.0, max_tokens=16, temperature=targets.temperature,
                                 top_p=targets.top_p)
        runs = [BenchRun(method="vanilla", settings=settings, tier=targets.vanilla_tier),
                BenchRun(method="self_consistency", settings=settings, tier=targets.tier)]

        def workers_for(tiers: Collection[str]) -> dict[str, Worker]:
            started.extend(tiers)
            names = workers_of(config, tiers)
            return {w.name: Worker(w, tmp_path, tmp_path, command=IDLE) for w in config.workers if w.name in names}

        prompts = select_prompts(str(tmp_path / "q.jsonl"), 3, 0)
        result = asyncio.run(run_benchmark(config, runs, prompts, arrival_offsets(3, 50.0, 0), dataset="q",
                                           workers_for=workers_for))
    assert sorted(started) == ["direct", "reason"]  # the greedy worker started too
    greedy = [b for b in bodies if "generation_config" not in b]
    sampled = [b for b in bodies if "generation_config" in b]
    # Vanilla: one request per question, asking temperature 0 of the greedy worker, with no sampling config.
    assert len(greedy) == 3 and all(b["temperature"] == 0.0 and "top_p" not in b for b in greedy)
    # The branches: the sampling worker's generation config, at its temperature and top_p.
    assert len(sampled) == 3 * 2
    assert all(json.loads(b["generation_config"])["do_sample"] and (b["temperature"], b["top_p"]) == (0.7, 0.95)
               for b in sampled)
    assert result["methods"]["vanilla"]["requests"] == result["methods"]["self_consistency"]["requests"] == 3


def test_vanilla_without_a_greedy_tier_of_the_same_model_is_refused_naming_what_to_add(tmp_path, capsys) -> None:
    line = refusal(tmp_path, capsys, ladder(greedy=False))
    assert "vanilla must decode greedily" in line and "worker `qwen-sampling` samples" in line
    assert 'add a [[workers]] entry with model = "qwen2.5-coder-0.5b" (temperature 0)' in line
    assert "leave vanilla out of --methods" in line


def test_a_greedy_tier_that_asks_with_another_system_prompt_does_not_stand_in_for_vanilla(tmp_path, capsys) -> None:
    line = refusal(tmp_path, capsys, ladder(prompt="Think step by step."))
    assert "tier `direct` does, but asks with another system_prompt" in line


def test_branched_methods_on_a_greedy_workers_tier_are_refused_as_the_gateway_refuses_them(tmp_path, capsys) -> None:
    line = refusal(tmp_path, capsys, ladder(), "--tier", "direct", "--methods", "vanilla,sart")
    assert "tier `direct`'s engine decodes every request greedily (worker `qwen` at temperature 0)" in line
    assert "`branches.n` > 1" in line and "tier `reason` runs the same model sampling" in line
    # So is a sweep (its points are branched), and vanilla alone runs there as it is.
    assert "greedily" in refusal(tmp_path, capsys, ladder(), "--tier", "direct", "--methods", "vanilla",
                                 "--sweep", "2:1")
    alone = bench_targets(decode_config(ladder()), "direct", vanilla=True, branched=False)
    assert alone.vanilla_tier == "direct"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--temperature", "0.5", "--temperature 0.5 differs from worker `qwen-sampling`'s temperature (0.7)"),
    ("--top-p", "0.8", "--top-p 0.8 differs from worker `qwen-sampling`'s top_p (0.95)"),
])
def test_a_branch_temperature_other_than_the_workers_is_refused(tmp_path, capsys, flag, value, message) -> None:
    line = refusal(tmp_path, capsys, ladder(), "--tier", "reason", "--methods", "sart", flag, value)
    assert message in line and "leave" in line
    # The worker's own value is what runs, and is accepted when asked for.
    same = bench_targets(decode_config(ladder()), "reason", vanilla=False, branched=True, temperature=0.7, top_p=0.95)
    assert (same.temperature, same.top_p) == (0.7, 0.95)


def test_tiers_that_honour_the_requests_temperature_run_every_method_where_they_are(tmp_path) -> None:
    write_inputs(tmp_path, "http://127.0.0.1:9")
    config = decode_config((tmp_path / "cascade.toml").read_text())
    assert bench_targets(config, "thinker", vanilla=True, branched=True) == BenchTargets(
        tier="thinker", vanilla_tier="thinker", temperature=0.7, top_p=1.0)  # branches.temperature, top_p sent
    assert bench_targets(config, "thinker", vanilla=True, branched=True, temperature=0.9, top_p=0.9).temperature == 0.9
    with pytest.raises(ConfigError, match="every branch would be the same greedy answer"):
        bench_targets(config, "thinker", vanilla=False, branched=True, temperature=0.0)


def test_the_embedded_ladders_vanilla_runs_on_its_direct_tier_of_the_reasoning_model() -> None:
    from cascade.engines.embedded import embedded_config

    config = embedded_config()
    assert bench_targets(config, config.tiers[-1].name, vanilla=True, branched=True) == BenchTargets(
        tier="qwen2.5-coder-1.5b-reason", vanilla_tier="qwen2.5-coder-1.5b", temperature=0.7, top_p=0.8)
