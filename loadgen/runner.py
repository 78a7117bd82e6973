"""Run a load test: send prepared requests on an absolute schedule (open loop) or with a fixed number
in flight (closed loop), and collect one `RequestRecord` per request.

Open loop: one dispatcher sleeps until each scheduled time (absolute, so lateness never accumulates),
then starts a task per request; when it is late it sends everything due at once. Dispatch lag is
measured per request as (time the request was written) - (scheduled time). Request bodies are
encoded before the clock starts, so the loop only writes bytes and parses responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from collections.abc import Iterable, Iterator, Sequence, Sized

import msgspec

from cascade.data.records import RequestRecord
from loadgen.client import Client, ResponseSink
from loadgen.pool import Started

START_LEAD_S = 0.05  # the schedule starts this long after setup, so the first sends are not late


@contextlib.contextmanager
def no_gc_pauses() -> Iterator[None]:
    """Keep the cyclic garbage collector out of the timed window: a full collection over thousands
    of records stalls the loop for tens of milliseconds. Records hold no cycles (refcounting frees
    them), so nothing accumulates meanwhile; collection resumes afterwards."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


class Planned(msgspec.Struct, kw_only=True):
    """A request ready to go: its record (ids, quality, reference) and its encoded HTTP bytes."""

    record: RequestRecord
    request: bytes


class RunResult(msgspec.Struct, kw_only=True):
    records: list[RequestRecord]
    duration_s: float
    loop: str
    connections_opened: int
    model: str = ""


PROGRESS_LINE_S = 10.0  # without a terminal: a progress line this often (a log, CI, `| tee`)


class _Progress:
    """Progress on stderr: a tqdm bar showing rate, in-flight and errors when stderr is a terminal (or forced), else
    a line every PROGRESS_LINE_S (a run of slow CPU models is minutes long, and a log should show it alive)."""

    def __init__(self, total: int | None, enabled: bool | None) -> None:
        self.sent = 0
        self.done = 0
        self.errors = 0
        self.total = total
        self.bar = None
        self.lines = enabled is None and not sys.stderr.isatty()
        if enabled is False or self.lines:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="req", desc="loadgen", file=sys.stderr, dynamic_ncols=True)

    async def run(self, every_s: float = 0.5) -> None:
        if self.bar is None and not self.lines:
            return
        every_s = PROGRESS_LINE_S if self.lines else every_s
        last_sent, last_t, started = 0, time.perf_counter(), time.perf_counter()
        while True:
            await asyncio.sleep(every_s)
            now = time.perf_counter()
            rate = (self.sent - last_sent) / (now - last_t)
            last_sent, last_t = self.sent, now
            if self.bar is None:
                print(f"loadgen: {self.line()}, {rate:.2f} req/s sent, {now - started:.0f} s", file=sys.stderr,
                      flush=True)
                continue
            self.bar.update(self.done - self.bar.n)
            self.bar.set_postfix(rate=f"{rate:.1f}/s", in_flight=self.sent - self.done, errors=self.errors,
                                 refresh=False)

    def line(self) -> str:
        of = "" if self.total is None else f"/{self.total}"
        return f"{self.done}{of} done, {self.sent - self.done} in flight, {self.errors} errors"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.done - self.bar.n)
            self.bar.close()
        elif self.lines:
            print(f"loadgen: {self.line()}", file=sys.stderr, flush=True)


async def _send(client: Client, plan: Planned, stream: bool, t0: float, due: float | None,
                progress: _Progress, started: tuple[ResponseSink, Started | None] | None = None) -> RequestRecord:
    progress.sent += 1
    try:
        record = await client.send(plan.record, plan.request, stream, t0, due, started)
    finally:
        progress.done += 1
        if plan.record.error is not None:
            progress.errors += 1
    return record


async def run_open_loop(client: Client, plans: Sequence[Planned], offsets: Sequence[float], *, stream: bool = True,
                        duration_s: float | None = None, drain_s: float | None = None,
                        progress: bool | None = None) -> RunResult:
    """Send `plans[i]` at `offsets[i]` seconds after the start; stop dispatching after `duration_s`."""
    bar = _Progress(len(plans), progress)
    ticker = asyncio.create_task(bar.run())
    tasks: list[asyncio.Task[RequestRecord]] = []
    t0 = time.perf_counter() + START_LEAD_S
    sleep, clock = asyncio.sleep, time.perf_counter
    for plan, offset in zip(plans, offsets, strict=False):
        if duration_s is not None and offset >= duration_s:
            break
        due = t0 + offset
        plan.record.scheduled_s = offset
        delay = due - clock()
        if delay > 0:
            await sleep(delay)
        # Written here when a connection is idle, so the send does not wait for the task's first step.
        started = client.start(plan.request, stream)
        tasks.append(asyncio.create_task(_send(client, plan, stream, t0, due, bar, started)))
    return await _finish(client, tasks, [p.record for p in plans[: len(tasks)]], drain_s, bar, ticker)


async def run_closed_loop(client: Client, plans: Iterable[Planned], concurrency: int, *, stream: bool = True,
                          duration_s: float | None = None, drain_s: float | None = None,
                          progress: bool | None = None) -> RunResult:
    """Keep `concurrency` requests in flight: each worker sends its next request when the last ends."""
    bar = _Progress(len(plans) if isinstance(plans, Sized) else None, progress)
    ticker = asyncio.create_task(bar.run())
    t0 = time.perf_counter()
    deadline = None if duration_s is None else t0 + duration_s
    queue = iter(plans)
    dispatched: list[RequestRecord] = []

    async def worker() -> None:
        for plan in queue:
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return
            plan.record.scheduled_s = now - t0
            dispatched.append(plan.record)
            await _send(client, plan, stream, t0, now, bar)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
    return await _finish(client, workers, dispatched, drain_s, bar, ticker)


async def _finish(client: Client, tasks: Sequence[asyncio.Task[object]], dispatched: list[RequestRecord],
                  drain_s: float | None, bar: _Progress, ticker: asyncio.Task[None]) -> RunResult:
    """Wait for in-flight requests (at most `drain_s`), cancel the rest (recorded as errors), close."""
    try:
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        bar.close()
        client.close()
    # Every dispatched request has its record, including those cancelled at the drain deadline.
    records = sorted(dispatched, key=lambda r: r.index)
    end_times = [r.sent_s + r.e2el_ms / 1000 for r in records if r.sent_s is not None and r.e2el_ms is not None]
    duration = max(end_times, default=0.0)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    return RunResult(records=records, duration_s=duration, loop=loop,
                     connections_opened=client.pool.opened)
