"""CPU per MiB of an SSE stream line arriving in pieces: cascade's EventData against the former reader. Prints JSON.

A broken engine (or anything between it and the gateway) can send one `data:` line of megabytes in 16 KiB reads.
The former reader joined its held bytes to every new read and split the whole again, so a line of L bytes cost
O(L^2 / read) on the gateway's event loop (8 MiB: about 1.7 s of CPU, every request on that process stalled with
it). EventData (cascade/branches/openai_wire.py) searches only the new read for a line end and grows a bytearray,
so the cost per megabyte stays flat, and a line past MAX_EVENT_BYTES (16 MiB) is a BackendFailed. Both readers run
here side by side on the same pieces, up to the limit (the former reader's quadratic cost is measured up to 8 MiB:
beyond it, minutes). Usage: .venv/bin/python -m benchmarks.frontdoor.sse_long_line [--read-kib 16] [--json-out F]
"""

from __future__ import annotations

import argparse
import sys
import time

from cascade.branches.openai_wire import MAX_EVENT_BYTES, EventData
from cascade.testing.scripts import print_result


class FormerEventData:
    """The reader before the fix, kept here only to measure against (its feed, verbatim)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        return [line[5:].strip() for line in lines if line.startswith(b"data:")]


def cpu_per_mib(reader: EventData | FormerEventData, line_mib: float, read_bytes: int) -> float:
    piece = b"x" * read_bytes
    pieces = int(line_mib * (1 << 20)) // read_bytes
    started = time.process_time()
    reader.feed(b"data: ")
    for _ in range(pieces):
        reader.feed(piece)
    reader.feed(b"\n")
    return (time.process_time() - started) / line_mib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--read-kib", type=int, default=16, help="bytes per read, KiB (default 16)")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    read_bytes = args.read_kib << 10
    sizes = [1, 2, 4, 8, MAX_EVENT_BYTES / (1 << 20) - 1]
    rows = []
    for mib in sizes:
        current = cpu_per_mib(EventData(), mib, read_bytes)
        former = cpu_per_mib(FormerEventData(), mib, read_bytes) if mib <= 8 else None
        rows.append({"line_mib": mib, "cpu_ms_per_mib": round(current * 1e3, 3),
                     "former_cpu_ms_per_mib": None if former is None else round(former * 1e3, 3),
                     "former_over_current": None if former is None else round(former / current, 1)})
    result = {"read_bytes": read_bytes, "max_event_bytes": MAX_EVENT_BYTES, "lines": rows,
              "current_largest_over_smallest": round(rows[-1]["cpu_ms_per_mib"] / max(rows[0]["cpu_ms_per_mib"], 1e-9),
                                                     2)}
    print_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
