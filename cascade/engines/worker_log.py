"""A worker's output, copied into its log file by a thread of ours: without the access lines of passing health
probes, and within a size cap.

Why: the gateway probes every engine's /health every 2 s (`[gateway.health] interval_s`), and `transformers serve`
runs uvicorn at log level info whatever its own `--log-level`, so each probe was one access line (~43,000 a day per
worker) in a log that only grew. A failing probe's line (not 200) is kept: it says why an engine went down.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import IO

# One file is at most this big; at the cap it becomes NAME.log.1 (replacing the older one) and a new file starts,
# so a worker's logs take at most twice this.
MAX_LOG_BYTES = 20 * 1024 * 1024
# A longer line (no newline in sight) is written in pieces of this size, so that memory stays bounded.
MAX_LINE_BYTES = 64 * 1024

# uvicorn's (transformers serve, SGLang) access line for a passing probe: `... "GET /health HTTP/1.1" 200 OK`.
_PASSING_PROBE = re.compile(rb'"GET /health(?:\?[^ "]*)? HTTP/[0-9.]+" 200\b')


def is_passing_health_probe(line: bytes) -> bool:
    return _PASSING_PROBE.search(line[:4096]) is not None  # an access line is short: a long one is not a probe


class LogPump:
    """Reads `source` (the worker's stdout and stderr) until it closes, appending to `path`."""

    def __init__(self, source: IO[bytes], path: Path, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.source = source
        self.path = path
        self.max_bytes = max_bytes
        self.dropped = 0  # passing health-probe lines left out
        self._thread = threading.Thread(target=self._run, name=f"log {path.name}", daemon=True)

    def start(self) -> LogPump:
        self._thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        out = _append(self.path, 0o644)
        try:
            size, whole = out.tell(), True  # whole: this piece starts a line (the last one ended with a newline)
            for line in iter(lambda: self.source.readline(MAX_LINE_BYTES), b""):
                starts, whole = whole, line.endswith(b"\n")
                if starts and whole and is_passing_health_probe(line):  # a piece of a longer run is not one
                    self.dropped += 1
                    continue
                if size and size + len(line) > self.max_bytes:
                    out = self._rotate(out)
                    size = 0
                out.write(line)
                out.flush()  # `Worker.tail` and an operator's `tail -f` see each line as it comes
                size += len(line)
        finally:
            out.close()
            self.source.close()

    def _rotate(self, out: IO[bytes]) -> IO[bytes]:
        mode = os.fstat(out.fileno()).st_mode & 0o777  # a private log (it may hold an API key) stays private
        out.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        return _append(self.path, mode)


def _append(path: Path, mode: int) -> IO[bytes]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    out = os.fdopen(fd, "ab")
    out.seek(0, os.SEEK_END)
    return out
