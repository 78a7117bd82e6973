"""The traffic log: one JSON line per served request, for drift checks and re-planning.

What `cascade optimize` needs to tell whether a plan still fits the traffic (issue 5, rescheduling):
arrival times, the quality hint, what the router said (difficulty, route score, p_fail per tier),
the tier that answered, escalations, token counts and latency. No prompt or answer text is written.
Lines are buffered and flushed at least every second, so a crash loses at most a second of records.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from cascade.schemas import TrafficRecord


class TrafficLog:
    FLUSH_S = 1.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self._encode = msgspec.json.Encoder().encode
        self._flushed = time.monotonic()

    def write(self, record: TrafficRecord) -> None:
        self._file.write(self._encode(record) + b"\n")
        now = time.monotonic()
        if now - self._flushed >= self.FLUSH_S:
            self._file.flush()
            self._flushed = now

    def close(self) -> None:
        self._file.close()


__all__ = ["TrafficLog", "TrafficRecord", "read_traffic"]


def read_traffic(path: str | Path) -> list[TrafficRecord]:
    decode = msgspec.json.Decoder(TrafficRecord).decode
    return [decode(line) for line in Path(path).read_bytes().splitlines() if line.strip()]
