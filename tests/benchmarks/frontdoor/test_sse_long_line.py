"""benchmarks/frontdoor/sse_long_line.py runs end to end and reports both readers side by side (its numbers are the
benchmark's business, not this test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_reports_both_readers_up_to_the_limit(tmp_path: Path) -> None:
    out = tmp_path / "r" / "sse.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.frontdoor.sse_long_line", "--read-kib", "1024", "--json-out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert [row["line_mib"] for row in result["lines"]] == [1, 2, 4, 8, 15.0]
    assert all(row["former_cpu_ms_per_mib"] is not None for row in result["lines"][:4])
    assert result["lines"][-1]["former_cpu_ms_per_mib"] is None and result["max_event_bytes"] == 16 << 20
