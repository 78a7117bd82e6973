"""The traffic log: one JSON line per served request, for drift checks and re-planning.

What `cascade optimize` needs to tell whether a plan still fits the traffic (issue 5, rescheduling):
arrival times, the quality hint, what the router said (difficulty, route score, p_fail per tier),
the tier that answered, escalations, token counts and latency. No prompt or answer text is written.
Every line is flushed as it is written (one small write per request, microseconds), so readers and
a crash never miss a served request.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from cascade.schemas import TrafficRecord


class TrafficLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")
        self._encode = msgspec.json.Encoder().encode

    def write(self, record: TrafficRecord) -> None:
        self._file.write(self._encode(record) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


__all__ = ["TrafficLog", "TrafficRecord", "read_traffic"]


def read_traffic(path: str | Path) -> list[TrafficRecord]:
    decode = msgspec.json.Decoder(TrafficRecord).decode
    return [decode(line) for line in Path(path).read_bytes().splitlines() if line.strip()]
