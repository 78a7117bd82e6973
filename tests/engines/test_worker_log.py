"""A worker's log: passing health-probe lines left out, failing ones kept, the file capped with one older copy, and
every other byte of the worker's output kept in order, whatever it writes (long runs, no newline, any bytes)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cascade.config import WorkerConfig
from cascade.engines.supervisor import Worker
from cascade.engines.worker_log import MAX_LINE_BYTES, LogPump, is_passing_health_probe

PROBE = b'INFO:     127.0.0.1:50412 - "GET /health HTTP/1.1" 200 OK\n'
FAILED = b'INFO:     127.0.0.1:50414 - "GET /health HTTP/1.1" 503 Service Unavailable\n'
REQUEST = b'INFO:     127.0.0.1:50416 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'


def pump(chunks: list[bytes], path: Path, max_bytes: int = 1 << 20) -> LogPump:
    read_fd, write_fd = os.pipe()
    running = LogPump(os.fdopen(read_fd, "rb"), path, max_bytes).start()

    def write() -> None:
        with os.fdopen(write_fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(30)
    running.join(30)
    return running


def test_a_workers_log_keeps_its_output_and_failing_probes_but_not_passing_probes(tmp_path) -> None:
    lines = b"".join([b"loading model\n", PROBE * 5, FAILED, REQUEST, PROBE])
    script = f"import sys; sys.stdout.buffer.write({lines!r}); sys.stdout.flush()"
    worker = Worker(WorkerConfig(name="w", model="m", port=1), tmp_path, tmp_path,
                    command=[sys.executable, "-c", script])
    worker.start()
    assert worker.process is not None and worker.process.wait(30) == 0
    assert worker.tail() == b"".join([b"loading model\n", FAILED, REQUEST]).decode().rstrip("\n")
    assert worker.log_pump is not None and worker.log_pump.dropped == 6


def test_the_log_rotates_at_its_cap_keeping_one_older_file(tmp_path) -> None:
    path = tmp_path / "w.log"
    line = b"x" * 99 + b"\n"
    pump([line] * 35, path, max_bytes=1000)  # 3500 bytes through a 1000-byte cap
    older = path.with_name("w.log.1")
    assert path.stat().st_size <= 1000 and older.stat().st_size == 1000
    assert path.read_bytes() == line * 5 and not path.with_name("w.log.2").exists()


def test_a_rotated_private_log_stays_private(tmp_path) -> None:
    path = tmp_path / "w.log"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    pump([b"a" * 60 + b"\n"] * 3, path, max_bytes=100)
    assert path.stat().st_mode & 0o777 == 0o600 and path.with_name("w.log.1").stat().st_mode & 0o777 == 0o600


def test_a_line_longer_than_the_line_limit_is_kept_whole_in_pieces(tmp_path) -> None:
    path = tmp_path / "w.log"
    long = b"y" * (3 * MAX_LINE_BYTES + 17)  # no newline at all
    pump([long, PROBE], path)
    assert path.read_bytes() == long + PROBE  # a probe glued to a long run is not an access line of its own


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), st.just(b"\n" * 200), st.just(b"{[" * 20000),
                          st.just(b"9" * 5000), st.just(PROBE), st.just(FAILED)), max_size=30))
def test_every_byte_but_passing_probe_lines_reaches_the_log(tmp_path_factory, chunks: list[bytes]) -> None:
    path = tmp_path_factory.mktemp("log") / "w.log"
    pump(chunks, path)
    data = b"".join(chunks)
    lines = data.split(b"\n")
    whole = [line + b"\n" for line in lines[:-1]]  # only a whole line, newline included, is ever left out
    probe = [len(line) <= MAX_LINE_BYTES and is_passing_health_probe(line) for line in whole]
    expected = b"".join(line for line, dropped in zip(whole, probe, strict=True) if not dropped) + lines[-1]
    assert path.read_bytes() == expected
