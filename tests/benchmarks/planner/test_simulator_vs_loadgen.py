"""benchmarks/planner/simulator_vs_loadgen.py end to end on the fake engine (about 12 s): profile, load test,
replay through the simulator, and the engine stopped afterwards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cascade.testing.processes import run

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.planner.simulator_vs_loadgen"


@pytest.mark.timeout(90)
def test_replaying_a_load_test_on_the_fake_engine_predicts_its_p95_within_25_percent(tmp_path: Path) -> None:
    # Times of tens of ms, so that scheduler jitter on a shared machine stays small next to them; the
    # fake's TTFT is short because the simulator lets each arrival's prefill stall the running batch,
    # which the fake (no batching) does not do.
    command = [sys.executable, "-m", MODULE, "--fake", "--rate", "5", "--n", "25", "--max-tokens", "64",
               "--fake-ttft-ms", "10", "--fake-itl-ms", "8", "--profile-prompt-tokens", "16,64,256",
               "--profile-repeats", "2", "--profile-max-batch", "4", "--profile-output-tokens", "16",
               "--profile-time-limit-s", "15", "--calibrate-n", "20", "--out", str(tmp_path / "run"), "--json-out", str(tmp_path / "r.json")]
    # Its own session: a timeout kills the script, its loadgen and its fake engine together.
    done = run(command, timeout_s=75, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads((tmp_path / "r.json").read_text())

    assert result["workload"]["completed"] == 25 and result["workload"]["failed"] == 0
    lengths = result["workload"]["output_tokens"]
    assert lengths["p95"] > 2 * lengths["p50"]  # the generated dataset's spread reached the engine
    assert result["profile"]["decode"]["fixed_s"] == pytest.approx(0.008, abs=0.003)
    assert result["within_25pct"]["replay_p95"], result["relative_error"]
    # The fake does not batch: shuffling lengths over the run's own arrivals keeps p95 near the replay's.
    own = result["predicted"]["own_arrivals_e2e_p95_s"]
    replay_p95 = result["predicted"]["replay"]["e2e_s"]["p95"]
    assert own["p10"] <= own["p50"] <= own["p90"] and own["p50"] == pytest.approx(replay_p95, rel=0.5)
    # Engine drift: a second profile after the load test, and the run in thirds with the batch-of-one ITL
    # read off the requests themselves; the fake's speed does not drift.
    assert result["profile_after"]["decode"]["fixed_s"] == pytest.approx(0.008, abs=0.003)
    assert result["relative_error"]["replay_p95_profile_after"] is not None
    phases = result["phases"]
    assert [p["requests"] for p in phases] == [9, 8, 8]
    alone = [p["alone_itl_ms_p50"] for p in phases if p["alone_itl_ms_p50"] is not None]
    assert alone and all(a == pytest.approx(8.0, abs=4.0) for a in alone), phases
    assert result["engine_drift"]["profile_decode_step_after_vs_before"] == pytest.approx(1.0, abs=0.5)

    # A profile fitted from a separate calibration load test (its own folder) predicts the run too.
    fitted = result["loadgen_profile"]
    assert fitted["path"] == "profile_loadgen.json (not in the repo)" and (tmp_path / "run" / "calibration" / "requests.jsonl").exists()
    assert fitted["decode"]["fixed_s"] == pytest.approx(0.008, abs=0.003)
    assert result["relative_error"]["replay_p95_loadgen_profile"] is not None
    assert result["predicted"]["loadgen_profile"]["planner"]["e2e_p95_s"] is not None

    # --from-run re-analyses the same folder without starting anything: same measurement, same replay.
    again = subprocess.run([sys.executable, "-m", MODULE, "--fake", "--rate", "5", "--n", "25", "--max-tokens", "64",
                            "--from-run", str(tmp_path / "run")], cwd=ROOT, capture_output=True, timeout=60)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    reanalysed = json.loads(again.stdout)
    assert reanalysed["measured"] == result["measured"]
    assert reanalysed["predicted"]["replay"] == result["predicted"]["replay"]
    assert reanalysed["predicted"]["loadgen_profile"] == result["predicted"]["loadgen_profile"]
    assert reanalysed["phases"] == result["phases"]

    # The fake engine was stopped: nothing listens on its port any more.
    url = urlsplit(result["target"]["url"])
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect((url.hostname, url.port))
