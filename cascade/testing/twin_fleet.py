"""A fleet of emulated GPUs in one process: every engine a `GpuSGLang` (cascade/testing/fakes/gpu.py) on its own
127.0.0.1 port, all on one event loop (issue 62 item 3: the goodput benchmark's G = 8 or 32 GPUs). One loop, not one
process per engine: on a 2-core machine 32 interpreters would take the CPU the emulated timeline needs, and an
engine's work is a few coroutine wake-ups per emulated step.

    python -m cascade.testing.twin_fleet SPEC.json

SPEC (`FleetSpec`): the time scale and, per engine, its profile file, the tier whose records it replays (with their
outcome files) and the model name it serves. Once every engine listens it prints one JSON line,
`{"urls": [...], "pid": N}` (engines in spec order) on stdout, then serves until killed. `GET /fake/gpu` on each
reports its scheduler (its `lag_s` says whether this CPU kept the emulated pace).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import uvicorn

from cascade.optimizer.profile import load_profile
from cascade.testing.fakes.answers import AnswerSource
from cascade.testing.fakes.gpu import GpuSGLang
from cascade.testing.fakes.recorded import load_recorded


class EngineSpec(msgspec.Struct, frozen=True, kw_only=True):
    profile: str  # a cascade profile (JSON), e.g. models/gpu/profiles/h200/qwen2.5-coder-1.5b.json
    tier: str  # the tier whose records it replays
    records: list[str]  # outcome files (later rows replace earlier ones: cascade/testing/fakes/recorded.py)
    model: str = ""  # the model name it serves (default: the tier's name)


class FleetSpec(msgspec.Struct, frozen=True, kw_only=True):
    time_scale: float = 1.0  # wall seconds per emulated second
    max_running: int = 0  # SGLang's --max-running-requests per engine (0: as many as the KV cache holds)
    stream_interval: int = 1  # SGLang's --stream-interval
    engines: list[EngineSpec]


class _Server(uvicorn.Server):
    """uvicorn's Server without its signal capture: many servers share one loop, and the fleet ends by a kill."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def engines(spec: FleetSpec) -> list[GpuSGLang]:
    """The spec's engines, records loaded once per (tier, files): engines of one tier share one replay."""
    answers: dict[tuple[str, tuple[str, ...]], AnswerSource] = {}
    out = []
    for e in spec.engines:
        key = (e.tier, tuple(e.records))
        if key not in answers:
            answers[key] = load_recorded(e.records, e.tier)
        out.append(GpuSGLang(load_profile(e.profile), answers[key], time_scale=spec.time_scale,
                             model=e.model or e.tier, max_running=spec.max_running,
                             stream_interval=spec.stream_interval))
    return out


async def serve(spec: FleetSpec) -> None:
    socks = []
    for _ in spec.engines:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    servers = [_Server(uvicorn.Config(engine, log_level="warning", access_log=False, lifespan="off"))
               for engine in engines(spec)]
    tasks = [asyncio.ensure_future(server.serve(sockets=[sock])) for server, sock in zip(servers, socks, strict=True)]
    while not all(server.started for server in servers):
        if any(t.done() for t in tasks):
            await asyncio.gather(*tasks)  # raises what stopped it
        await asyncio.sleep(0.01)
    urls = [f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in socks]
    sys.stdout.write(msgspec.json.encode({"urls": urls}).decode() + "\n")
    sys.stdout.flush()
    await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m cascade.testing.twin_fleet SPEC.json\n")
        return 2
    spec = msgspec.json.decode(Path(args[0]).read_bytes(), type=FleetSpec)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(spec))
    else:
        uvloop.run(serve(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
