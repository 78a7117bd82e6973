"""Long prompts assessed in a child process, so that the router's Python work does not hold the serving process's GIL.

Why a process, not a thread: the router's features are Python loops over a prompt's tokens (lexical counts, hashed
word pairs, the domain check's word model), about 0.6 us a character of a GSM8K question but up to 5 us a character
of hostile text (one token per character: `1+1+...`, digits between no-break spaces), so the `max_prompt_chars`
(8 KiB) it reads may cost 40 ms. In a thread that work holds the GIL in 5 ms slices against the event loop, which
then serves every other request at about half speed until it ends: one hostile client sending such prompts raised
the p99 of normal clients beside it by 15-19 % (docs/measured.md, "Hostile clients"). In a child process it runs on
another core, and the loop pays only for sending 8 KiB and receiving the verdict (~0.1 ms).

`ProcessAssessor` starts its child on the first prompt it is given (a gateway whose prompts are all short never
starts one), with the policy pickled as it is in the parent (the learned router: ~0.4 MB, unpickled in ~10 ms), and
one child per serving process (`--processes N` starts N), forked from a fork server that imported the router's
modules once (`_context`). While the child starts (the first one in a process: ~2 s, the server's imports) and
whenever it is gone (killed, crashed), prompts are assessed in a thread as before, so a broken child costs speed,
never an answer; a child that died is started again at most every RESTART_S.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import multiprocessing
import pickle
import threading
import time
import weakref
from concurrent.futures.process import BrokenProcessPool

from cascade.router.policy import Assessed, RoutingPolicy

log = logging.getLogger("cascade.gateway")

RESTART_S = 30.0  # a child that died is replaced at most this often
# Imported once by the fork server its children are forked from: the policy's signals (the learned router's
# classifier, scikit-learn) and this module.
PRELOAD = ("cascade.router.offload", "cascade.router.signals", "cascade.router.classifier")

_policy: RoutingPolicy | None = None  # the child's copy


def _install(policy: bytes) -> None:
    global _policy
    _policy = pickle.loads(policy)  # the parent's own policy, pickled by the parent


def _assess(text: str) -> Assessed:
    assert _policy is not None, "the child's initializer installs the policy"
    return _policy.assess(text)


def _ready() -> bool:
    return _policy is not None


@functools.cache
def _context() -> multiprocessing.context.BaseContext:
    """A fork server, not fork: the serving process has threads (counting pools, an event loop) that a fork would
    copy mid-flight. The server is started once per serving process with the router's modules imported (PRELOAD),
    so each child after the first is a fork of it (~0.1 s), not a fresh interpreter (~2 s of imports)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


class ProcessAssessor:
    """`assess(text)` for `policy`, in one child process once it is up (module docstring)."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._up = False  # the child answered its first call
        self._started_at = -RESTART_S
        self.child_calls = 0  # prompts the child assessed (tests, and what a reader of the metrics may ask)

    async def assess(self, text: str) -> Assessed:
        """The policy's verdict on `text` (already cut to what the router reads), off the event loop."""
        pool = self._running_pool()
        if pool is not None and self._up:
            try:
                assessed = await asyncio.get_running_loop().run_in_executor(pool, _assess, text)
            except BrokenProcessPool:
                self._lost(pool)
            else:
                self.child_calls += 1
                return assessed
        return await asyncio.to_thread(self.policy.assess, text)

    def close(self) -> None:
        """Stop the child (idempotent); later prompts are assessed in threads."""
        with self._lock:
            pool, self._pool, self._up = self._pool, None, False
            self._started_at = float("inf")  # never again
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _running_pool(self) -> concurrent.futures.ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and time.monotonic() - self._started_at >= RESTART_S:
                self._started_at = time.monotonic()
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=_context(), initializer=_install, initargs=(pickle.dumps(self.policy),))
                # The child goes with this assessor when nobody closed it (a service dropped without `close`).
                weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
                self._pool.submit(_ready).add_done_callback(functools.partial(self._came_up, self._pool))
            return self._pool

    def _came_up(self, pool: concurrent.futures.ProcessPoolExecutor, ready: concurrent.futures.Future[bool]) -> None:
        if not ready.cancelled() and ready.exception() is None:
            with self._lock:
                self._up = self._pool is pool
            return
        if not ready.cancelled():
            log.warning("the router's child process did not start (%s); long prompts are routed in threads",
                        ready.exception())
        self._lost(pool, quiet=True)

    def _lost(self, pool: concurrent.futures.ProcessPoolExecutor, quiet: bool = False) -> None:
        if not quiet:
            log.warning("the router's child process died; long prompts are routed in threads until it restarts")
        with self._lock:
            if self._pool is pool:
                self._pool, self._up = None, False
        pool.shutdown(wait=False, cancel_futures=True)
