"""Running `cascade bench branches`' methods (cascade/bench/methods.py) on their tiers, resumably.

Resume (with `--out DIR`): each request's record is appended to DIR/requests.jsonl, and flushed, the moment
it completes, under its run's key: a hash of everything that decides how it ran (method, N, M, alpha, beta,
K, slots, max tokens, temperature, top_p, rate, seed, the tier it ran on and the dataset). Rerunning the same
command reads the file back and runs only the requests that have no record under their run's key yet, or whose
record is an error, so a larger `--n-questions` runs only the questions it adds (see `resume_key`; records keyed
before 2026-11-26 included the question count and are not resumed). The summary covers all of them and says how
many came from a previous run (`resumed`). Only the workers of tiers with requests left are started. With
`--save-branches FILE` the file is appended to, and a request whose branches it already holds (same key,
same question) does not write them again. `--fresh` starts both files over.

Latency in a resumed run: a finished request keeps the latency measured in the run that finished it. The
requests left keep their planned arrival offsets, shifted so that the first of them arrives at once; the
finished ones no longer compete with them for slots, so they may queue less than they would have in one
uninterrupted run (each method's `resumed` says how many of its requests that concerns).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np

from cascade.bench.methods import BenchSettings, RequestRecord, method_settings, run_key, run_method, summarize
from cascade.config import CascadeConfig
from cascade.data.records import Prompt
from cascade.engines.supervisor import Worker
from cascade.errors import ConfigError
from cascade.machine import fingerprint
from cascade.tiers.lifecycle import running_tiers


class BenchRun(msgspec.Struct, frozen=True, kw_only=True):
    """One method's run on `tier` with `settings`; `main`: one of --methods (else a --sweep point)."""

    method: str
    settings: BenchSettings
    tier: str
    main: bool = True


class RequestRow(RequestRecord, kw_only=True):
    """A line of requests.jsonl: one request's record and the run it belongs to."""

    method: str = ""
    n: int = 0
    m: int = 0
    tier: str = ""
    key: str = ""  # its run's resume_key; a row without one (an older file) is never resumed
    # The machine that ran it (cascade/machine.py): a resumed run may finish on another, with other latencies.
    machine: str = ""


def resume_key(run: BenchRun, dataset: str) -> str:
    # Not the number of questions: records are kept per question, and the seeded order's first n questions are
    # the same for every n below the dataset's size, so a run extended from 100 to 200 questions runs 100.
    raw = run_key(run.method, run.settings, run.tier) + msgspec.json.encode([dataset])
    return hashlib.sha256(raw).hexdigest()[:16]


async def run_benchmark(
    config: CascadeConfig, runs: list[BenchRun], prompts: list[Prompt], offsets: np.ndarray, *, dataset: str,
    workers_for: Callable[[Collection[str]], dict[str, Worker]], out: Path | None = None, fresh: bool = False,
    save_branches: Path | None = None,
) -> dict[str, Any]:
    """Run `runs` one after the other, a run whose key an earlier one had only once, and return {"methods":
    {method: summary} (main runs), "sweep": [{method, n, m, **summary}], "resumed": requests from a previous
    run}. `workers_for(tier names)` gives the (unstarted) workers those tiers run on; they are started here."""
    from tqdm import tqdm

    keys = [resume_key(r, dataset) for r in runs]
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--out: cannot create {out}: {exc.strerror}") from None
    results = Results(None if out is None else out / "requests.jsonl", fresh)
    sink = None if save_branches is None else BranchSink(save_branches, append=out is not None and not fresh)
    try:
        owner: dict[str, BenchRun] = {}  # each key's first run: the one that runs it
        for run, key in zip(runs, keys, strict=True):
            owner.setdefault(key, run)
        left = {key: [i for i, p in enumerate(prompts) if p.id not in results.finished(key)] for key in owner}
        needed = sorted({owner[key].tier for key, todo in left.items() if todo})
        summaries: dict[str, dict[str, Any]] = {}
        async with running_tiers(config, needed, workers=workers_for(needed) if needed else {}) as fleet:
            with tqdm(total=sum(map(len, left.values())), desc="bench branches", unit="request") as bar:
                for run, key in zip(runs, keys, strict=True):
                    if key in summaries:
                        continue
                    todo = left[key]
                    if todo:
                        ran = method_settings(run.method, run.settings)
                        bar.set_postfix_str(f"{run.method} N={ran.n} M={ran.m}")
                        await run_method(fleet.tier(run.tier), run.method, run.settings, [prompts[i] for i in todo],
                                         offsets[todo] - offsets[todo].min(), results.recorder(run, key, bar.update),
                                         None if sink is None else sink.writer(run, key))
                    records = [results.latest[key][p.id] for p in prompts]
                    summaries[key] = {**summarize(records), "resumed": len(prompts) - len(todo)}
    finally:
        results.close()
        if sink is not None:
            sink.close()
    methods = {r.method: summaries[k] for r, k in zip(runs, keys, strict=True) if r.main}
    sweep = [{"method": r.method, "n": r.settings.n, "m": r.settings.m, **summaries[k]}
             for r, k in zip(runs, keys, strict=True) if not r.main]
    return {"methods": methods, "sweep": sweep, "resumed": sum(s["resumed"] for s in summaries.values())}


class Results:
    """Request records by run key and question id, the latest of each: a previous run's (read from `path`
    unless `fresh`) and this run's, each appended to `path` as it completes."""

    def __init__(self, path: Path | None, fresh: bool) -> None:
        self.latest: dict[str, dict[str, RequestRecord]] = defaultdict(dict)
        self._file: IO[bytes] | None = None
        if path is None:
            return
        if not fresh:
            for row in request_rows(path):
                if row.key:
                    self.latest[row.key][row.id] = row
        self._file = _open_log(path, append=not fresh, what="--out")

    def finished(self, key: str) -> set[str]:
        return {qid for qid, r in self.latest[key].items() if r.error is None}

    def recorder(self, run: BenchRun, key: str, then: Callable[[], Any]) -> Callable[[RequestRecord], None]:
        def record(r: RequestRecord) -> None:
            self.latest[key][r.id] = r
            if self._file is not None:
                # The M that ran: self-consistency and prune_only wait for all N whatever --m says.
                row = RequestRow(**msgspec.structs.asdict(r), method=run.method, n=run.settings.n,
                                 m=method_settings(run.method, run.settings).m, tier=run.tier, key=key,
                                 machine=fingerprint())
                self._file.write(msgspec.json.encode(row) + b"\n")
                self._file.flush()
            then()

        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class BranchSink:
    """--save-branches: each self-consistency or adaptive request's finished branches, written when it completes."""

    def __init__(self, path: Path, append: bool) -> None:
        self.saved: set[tuple[str, str]] = set()  # (run key, question id) already in the file
        if append:
            for row in _json_lines(path):
                if isinstance(row, dict) and row.get("key"):
                    self.saved.add((row["key"], row.get("id", "")))
        self._file = _open_log(path, append=append, what="--save-branches")

    def writer(self, run: BenchRun, key: str) -> Callable[[list[dict]], None]:
        def write(rows: list[dict]) -> None:
            if not rows or (key, rows[0]["id"]) in self.saved:
                return
            self.saved.add((key, rows[0]["id"]))
            labels: dict[str, object] = {"method": run.method, "n": run.settings.n, "key": key}
            if run.settings.sampling_seed is not None:  # (id, seed, branch) names a branch: a second sample's apart
                labels["seed"] = run.settings.sampling_seed
            self._file.writelines(json.dumps({**row, **labels}).encode() + b"\n" for row in rows)
            self._file.flush()

        return write

    def close(self) -> None:
        self._file.close()


def request_rows(path: Path) -> Iterator[RequestRow]:
    """The request records of a requests.jsonl in file order (none if it does not exist)."""
    decoder = msgspec.json.Decoder(RequestRow)
    for line in _lines(path):
        try:
            yield decoder.decode(line)
        except msgspec.DecodeError:
            continue  # a line cut short when a run was stopped, or not a request row


def json_rows(path: Path) -> Iterator[Any]:
    """The JSON values of a JSONL file, gzipped (`.gz`) or not, in file order: a missing file gives none, and a line
    or a gzip member cut by an interrupted run ends nothing before it or after it (long runs append as they go: a
    resumed run appends a new member after the one its killed predecessor left without an end)."""
    if path.suffix != ".gz":
        lines = iter(_lines(path))
    elif (data := _read(path)) and not data.startswith(GZIP_MAGIC):
        raise ConfigError(f"{path}: not gzip (a .gz file starts with bytes 1f 8b 08)")
    else:
        lines = _gzip_lines(data)
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue


GZIP_MAGIC = b"\x1f\x8b\x08"  # a gzip member's first bytes (ID1, ID2, deflate)
GZIP_STEP = 65_536  # compressed bytes fed at a time (the one where a member stops decoding is fed again in 64s)


def _gzip_lines(data: bytes) -> Iterator[bytes]:
    """The complete lines of every gzip member in `data`, in order. `gzip` stops at a member without an end (a run
    killed mid-write) or fails on the member a later run appended after it; here a cut member gives the lines it
    holds up to where its bytes stop decoding (the cut line dropped), and reading goes on at the next member."""
    view, start = memoryview(data), data.find(GZIP_MAGIC)  # a view: no copy of the file per chunk
    while start >= 0:
        decompressor, out, pos = zlib.decompressobj(wbits=31), bytearray(), start
        while pos < len(data) and not decompressor.eof:
            chunk, before = view[pos:pos + GZIP_STEP], decompressor.copy()
            try:
                out += decompressor.decompress(chunk)
            except zlib.error:  # where this member's bytes stop decoding: take what the chunk held before that
                out += _decoded_until_error(before, chunk)
                break
            pos += len(chunk) - (len(decompressor.unused_data) if decompressor.eof else 0)
        if not decompressor.eof:  # a cut member: its last line may be cut too; the next member starts further on
            del out[out.rfind(b"\n") + 1:]
            pos = start + 1
        yield from bytes(out).splitlines()
        start = data.find(GZIP_MAGIC, pos)  # (a false match inside a cut member fails fast)


def _decoded_until_error(decompressor: Any, chunk: memoryview, step: int = 64) -> bytes:
    out = bytearray()
    for at in range(0, len(chunk), step):
        try:
            out += decompressor.decompress(chunk[at:at + step])
        except zlib.error:
            break
    return bytes(out)


def _json_lines(path: Path) -> Iterator[Any]:
    for line in _lines(path):
        try:
            yield json.loads(line)
        except ValueError:
            continue


def _lines(path: Path) -> list[bytes]:
    return _read(path).splitlines()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def _open_log(path: Path, *, append: bool, what: str) -> IO[bytes]:
    """`path` opened to append to (ending a line a stopped run cut short) or to write afresh."""
    try:
        torn = append and path.exists() and path.stat().st_size > 0 and _last_byte(path) != b"\n"
        f = path.open("ab" if append else "wb")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot write {path}: {exc.strerror}") from None
    if torn:
        f.write(b"\n")
    return f


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1)
