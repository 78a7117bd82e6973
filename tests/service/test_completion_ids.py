"""Completion ids: `chatcmpl-` + 32 hex digits, never repeated in a process or by a forked worker."""

from __future__ import annotations

import os
import re

from cascade.service.responses import completion_id

SHAPE = re.compile(r"chatcmpl-[0-9a-f]{32}")


def test_ids_have_openais_shape_and_never_repeat_in_a_process() -> None:
    ids = [completion_id() for _ in range(10_000)]
    assert all(SHAPE.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_worker_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: `cascade serve --processes` forks its workers
        os.close(read)
        os.write(write, " ".join(completion_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {completion_id() for _ in range(100)}
    assert len(child) == 100 and not child & parent
    assert {i[:29] for i in child} != {i[:29] for i in parent}  # a different random prefix, not luck
