"""benchmarks/frontdoor/replica_affinity.py end to end on a small grid: fake engines with prefix caches behind `cascade serve`,
multi-turn ShareGPT sessions, both policies, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODULE = "benchmarks.frontdoor.replica_affinity"


def test_choice_by_prefix_finds_every_later_turns_previous_prompt_cached(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", MODULE, "--replicas", "2", "--conversations", "4", "--max-turns", "3",
                           "--concurrency", "2", "--seeds", "0", "--max-running", "8", "--ttft-ms", "5",
                           "--cached-ttft-ms", "1", "--itl-ms", "0", "--tokens", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert json.loads(out.read_text()) == result
    runs = {r["policy"]: r for r in result["runs"]}
    assert set(runs) == {"least_outstanding", "prefix@1.25"}
    for run in runs.values():
        assert run["errors"] == 0 and run["requests"] == sum(run["requests_per_replica"])
        assert run["gateway_cached_prompt_tokens"] == run["cached_tokens"]  # the gateway read the engines' usage
    prefix = runs["prefix@1.25"]
    # Two sessions on two replicas never fill one (bound ceil(1.25 x 2 / 2) = 2): no spill, so every later turn
    # finds its previous prompt where it left it, and the hit rate is the ceiling.
    assert prefix["spills"] == 0
    assert prefix["token_hit_rate"] == result["config"]["ideal_token_hit_rate"]["0"]
    later_turns = prefix["requests"] - 4
    assert prefix["request_hit_rate"] == round(later_turns / prefix["requests"], 4)
    assert set(result["summary"]["max_running_8"]) == {"least_outstanding", "prefix@1.25"}
