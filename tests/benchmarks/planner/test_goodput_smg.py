"""Arm g of the goodput benchmark (cascade picking the tier, SGLang's model gateway `smg` picking the replica) and the
smg helper it shares with arm a (benchmarks/planner/goodput/smg.py): what cascade meets when a tier's backend is an
smg rather than its engines (no /abort_request, no /metrics; `rid` passed through; a closed stream closed upstream),
bounded start-up, and arm g end to end on two emulated GPUs for a few seconds. Skipped, with why, where smg's wheel
cannot be installed."""

from __future__ import annotations

import http.client
import json
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from benchmarks.planner.goodput import arms, smg
from benchmarks.planner.goodput.arms import NO_ENGINE, PLAIN_TIER, REASON_TIER, Arm
from benchmarks.planner.goodput.run import Setting, measure
from cascade.optimizer.profile import load_profile
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.gpu import GpuSGLang
from cascade.testing.twin import H200
from cascade.testing.waiting import eventually
from tests.benchmarks.planner.test_goodput_per_gpu import two_recorded_folds

MAX_RUNNING = 16


@pytest.fixture(scope="module")
def smg_exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = smg.available(tmp_path_factory.mktemp("smg-install"))
    if isinstance(exe, str):
        pytest.skip(f"smg is not available here: {exe}")
    return exe


def _status(method: str, url: str, body: dict[str, object] | None = None) -> int:
    request = urllib.request.Request(url, None if body is None else json.dumps(body).encode(),
                                     {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_each_tier_with_gpus_has_one_smg_backend_and_the_vote_keeps_every_gpus_slots() -> None:
    arm = Arm("g", {PLAIN_TIER: 2, REASON_TIER: 3}, tier_smg="cache_aware")
    urls = {PLAIN_TIER: ["http://127.0.0.1:1001"], REASON_TIER: ["http://127.0.0.1:1002"]}
    config = tomllib.loads(arms.gateway_toml(arm, urls, "A", max_running=MAX_RUNNING))
    by_tier = {t["name"]: t for t in config["tiers"]}
    assert [b["url"] for b in by_tier[PLAIN_TIER]["backends"]] == urls[PLAIN_TIER]
    assert [b["url"] for b in by_tier[REASON_TIER]["backends"]] == urls[REASON_TIER]
    assert by_tier[REASON_TIER]["branches"]["slots"] == MAX_RUNNING * 3  # three GPUs behind the one backend
    assert all(b["url"] == NO_ENGINE for t in config["tiers"] if t["name"] not in urls for b in t["backends"])
    assert config["routing"]["engine_load"]["enabled"] is False  # smg has no /metrics to poll
    assert "engine_load" not in tomllib.loads(arms.gateway_toml(Arm("t", arm.replicas), urls, "A",
                                                                max_running=MAX_RUNNING))["routing"]


def test_smg_in_front_of_an_engine_passes_the_rid_and_closes_a_cut_stream_but_has_no_abort_or_metrics(
        smg_exe: Path, tmp_path: Path) -> None:
    engine = GpuSGLang(load_profile(H200 / "qwen2.5-coder-1.5b.json"), time_scale=1.0, disconnect_abort_s=0.5,
                       model=PLAIN_TIER)
    with serve_asgi(engine) as engine_url, smg.gateway([engine_url], "cache_aware", tmp_path) as url:
        assert _status("POST", f"{url}/abort_request", {"rid": "anything"}) == 404
        assert _status("GET", f"{url}/metrics") == 404
        assert _status("GET", f"{engine_url}/metrics") == 200  # what cascade's poller reads on an engine
        at = urlsplit(url)
        conn = http.client.HTTPConnection(at.hostname or "", at.port, timeout=10)
        body = {"model": PLAIN_TIER, "messages": [{"role": "user", "content": "count"}], "stream": True,
                "max_tokens": 3000, "rid": "armg-probe-0"}  # ~12 s of decoding on the emulated H200
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        first = next(line for line in iter(response.readline, b"") if line.startswith(b"data: "))
        assert json.loads(first[len(b"data: "):])["id"] == "armg-probe-0"  # the engine saw our rid
        conn.close()  # the client goes away mid-stream: smg closes its stream to the engine, which stops
        assert eventually(lambda: engine.stats.streams_cancelled == 1, within_s=5.0)
        assert engine.stats.abort_requests == [] and engine.stats.tokens_sent < 3000
    with pytest.raises(OSError):  # smg is gone with the block
        urllib.request.urlopen(f"{url}/health", timeout=2)


def test_an_smg_whose_workers_never_register_is_an_error_within_its_bound(smg_exe: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="0 of 1 workers"), \
            smg.gateway(["http://127.0.0.1:9"], "cache_aware", tmp_path, ready_s=3.0):
        pass
    assert time.monotonic() - started < 15.0


def test_arm_g_end_to_end_on_two_emulated_gpus_answers_as_recorded(smg_exe: Path, tmp_path: Path) -> None:
    """One GPU per tier, each behind its own smg, cascade in front; every request to the reasoning tier, so that
    every one of them runs the vote's branches through smg (the twin replays each branch by its rid)."""
    recorded, folds = two_recorded_folds(tmp_path)
    ids = [q for fold in folds for q in fold.questions]
    setting = Setting(time_scale=1.0, max_running=MAX_RUNNING, stream_interval=8, ttft_slo_s=30.0, e2e_slo_s=60.0,
                      requests_per_fold=4, arrival="poisson")
    arm = Arm("g-test", {PLAIN_TIER: 1, REASON_TIER: 1}, model=REASON_TIER, tier_smg="cache_aware")
    work = tmp_path / "run"
    point = measure(arm, folds, rate=2.0, seed=0, setting=setting, work=work, quality={})
    rows = point["requests"]
    assert len(rows) == 8 and {r["q"] for r in rows} == set(ids)
    assert all(r["error"] is None and r["tier"] == REASON_TIER for r in rows)
    assert {r["q"]: r["correct"] for r in rows} == {q: bool(recorded[q].tiers[REASON_TIER].correct) for q in ids}
    assert {p.name for p in work.glob("smg-*.log")} == {f"smg-{PLAIN_TIER}.log", f"smg-{REASON_TIER}.log"}
    engines = point["engines"]
    assert engines["aborts_received"] == 0 and engines["tokens_sent"] > 0 and engines["gpu_busy_s"] > 0
    spread = engines["requests_by_engine"]  # every branch (two at least per request) on the reasoning tier's GPU
    assert spread[PLAIN_TIER] == [0] and spread[REASON_TIER][0] >= 2 * len(rows)
