"""`cascade deploy`: start a plan's engines on this machine, supervise them, write the gateway config
that points at them, and stop them all on SIGINT/SIGTERM. Reads plan.json only.

* `--engine sglang`: one `python -m sglang.launch_server` per server of the SGLang placement
  (cascade/engines/sglang_launch.py) with its CUDA_VISIBLE_DEVICES. A plan that spans nodes is
  started by running the same command on every node with the same `--hosts` and that node's
  `--node`: each node launches and supervises its own servers (a replica larger than a node has one
  server per node; ranks > 0 serve no HTTP and are supervised by liveness), and every node writes
  the same gateway config, pointing at the rank-0 servers by host name.
  Servers bind 127.0.0.1 on one node and their own node's name in `--hosts` otherwise, or
  `--engine-host`. When the environment variable `--engine-api-key-env` names is set, every server
  gets `--api-key` with its value and the written gateway config carries it (mode 0600): cascade.toml
  cannot read the environment. Printed commands and --dry-run show `"$NAME"`, never the value.
  Each server gets its tier's SGLang output parsers (`--reasoning-parser`, `--tool-call-parser`): the
  plan's, or for a tier whose plan leaves them out, its model card's (`with_card_parsers`); and
  `--enable-deterministic-inference` where the plan's tier asks for reproducible branches
  (`deterministic`) or `--deterministic` asks it for every tier.
* `--engine local`: one process per tier replica on 127.0.0.1 (TP/PP do not apply on a CPU):
  `transformers serve` of the tier's embedded model (`cascade models list`), or `--engine-command`,
  a template with {port}, {model}, {tier} and {replica}, e.g. `cascade fake-server --port {port}
  --model {model}`.

Supervision is cascade/engines/supervisor.py's, as for `cascade serve`: every engine in its own
process group, health-checked at start, restarted with backoff when it dies, and on shutdown its
whole group terminated (SIGTERM, then SIGKILL), so that no engine outlives the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import math
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from cascade.config import Timeouts, WorkerConfig
from cascade.engines import sglang_launch
from cascade.engines.supervisor import Supervisor, Worker, free_port, worker_command
from cascade.errors import ConfigError
from cascade.optimizer import cards
from cascade.plan import Plan

PLACEHOLDERS = ("port", "model", "tier", "replica")
DEFAULT_API_KEY_ENV = "CASCADE_ENGINE_API_KEY"


@dataclass(frozen=True)
class Engine:
    """One process to run: its argv serves `model` for `tier` on `port` of `host`."""

    name: str
    tier: str
    model: str
    port: int
    argv: list[str]
    env: dict[str, str] | None = None  # None: the embedded workers' environment (offline hub)
    kind: str = "openai"  # the gateway backend kind that talks to it
    embedded: str = ""  # the embedded model card to prepare before the start
    serves_http: bool = True  # False: a multi-node replica's rank > 0 (no HTTP server; liveness only)
    host: str = "127.0.0.1"  # the address it listens on

    @property
    def url(self) -> str:
        """Where this node reaches it (a wildcard bind answers on loopback)."""
        return f"http://{sglang_launch.url_host(_reach(self.host))}:{self.port}"


def engine_api_key(env_name: str) -> str:
    """The engine API key from the environment variable `env_name` ("" when unset or empty). Errors never
    show the value."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env_name):
        raise ConfigError(f"--engine-api-key-env {env_name!r} is not an environment variable name "
                          f"(letters, digits, _), e.g. {DEFAULT_API_KEY_ENV}")
    key = os.environ.get(env_name, "")
    if key and (key != key.strip() or not all(" " <= c <= "~" for c in key)):
        raise ConfigError(f"${env_name}: the engine API key must be printable ASCII without leading or trailing "
                          "spaces (it travels in an HTTP header); set it again")
    return key


def exposure_warning(binds: set[str], api_key: bool, env_name: str) -> str | None:
    """One line when engines listen beyond loopback without an API key, else None."""
    exposed = sorted(b for b in binds if not sglang_launch.is_loopback(b))
    if not exposed or api_key:
        return None
    return (f"warning: the SGLang engines bind {', '.join(exposed)}, reachable from the network, without an API key: "
            f"set ${env_name} (--engine-api-key-env) to require one, or bind 127.0.0.1 (--engine-host)")


def with_card_parsers(plan: Plan) -> Plan:
    """The plan with every SGLang output parser it leaves unset (None) taken from the model card that
    serves its tier's model ("" where no card does, or the card names none)."""
    deployment = []
    for d in plan.deployment:
        if None in (d.reasoning_parser, d.tool_call_parser):
            card = cards.served_card(d.model)
            found = {"reasoning_parser": card.reasoning_parser if card else "",
                     "tool_call_parser": card.tool_call_parser if card else ""}
            d = msgspec.structs.replace(d, **{key: name for key, name in found.items() if getattr(d, key) is None})
        deployment.append(d)
    return msgspec.structs.replace(plan, deployment=deployment)


def sglang_engines(plan: Plan, base_port: int, dp_per_server: bool, hosts: list[str] | None = None,
                   node: str | None = None, engine_host: str | None = None,
                   api_key: str = "", deterministic: bool = False) -> tuple[list[Engine], str]:
    """This node's SGLang servers and the gateway config of the whole deployment. A single-node plan
    runs on 127.0.0.1 without `hosts`; a plan that spans nodes needs `hosts` (every node's name, the
    same list on every node) and `node`, the name in it of the machine this runs on. Servers bind
    their node's name, or `engine_host`; `api_key` goes into their argv and into the config. Output
    parsers the plan leaves unset come from the model cards; `deterministic` applies to every tier."""
    if importlib.util.find_spec("sglang") is None:
        raise ConfigError("cannot launch SGLang: the `sglang` package is not importable by this Python "
                          "(install it on the GPU node: pip install \"sglang[all]\"), or run with --dry-run and "
                          "start the printed commands on each node")
    if not 1 <= base_port <= 65000:
        raise ConfigError(f"--base-port must be between 1 and 65000, got {base_port}")
    per_node = plan.gpus_per_node or 8
    nodes = math.ceil(sum(d.gpus for d in plan.deployment) / per_node)
    if nodes > 1 and (not hosts or node is None):
        raise ConfigError(f"the plan spans {nodes} nodes of {per_node} GPUs: pass --hosts (all {nodes} node names, "
                          "the same on every node) and --node (this node's name), and run the command on each node")
    if node is not None and node not in (hosts or []):
        raise ConfigError(f"--node `{node}` is not one of --hosts ({', '.join(hosts or []) or 'none given'})")
    names = hosts or ["127.0.0.1"]
    launch = sglang_launch.launch_plan(with_card_parsers(plan), hosts=names, base_port=base_port,
                                       dp_per_server=dp_per_server, engine_host=engine_host, api_key=api_key,
                                       deterministic=deterministic)
    here = node or names[0]
    engines: list[Engine] = []
    for s in launch.servers:
        if s.host != here:
            continue
        replica = sum(e.tier == s.tier for e in engines)
        rank = f"-rank{s.node_rank}" if s.nnodes > 1 else ""
        engines.append(Engine(name=f"{s.tier}-{replica}{rank}", tier=s.tier, model=s.model, port=s.port,
                              kind="sglang", argv=[sys.executable, "-m", "sglang.launch_server", *s.args(api_key)],
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES=s.cuda_visible_devices),
                              serves_http=s.node_rank == 0, host=s.listen))
    if not engines:
        raise ConfigError(f"the plan places no server on node `{here}`")
    return engines, launch.config_toml  # every node's rank-0 servers, by host name (127.0.0.1 on one node)


def _reach(listen: str) -> str:
    """Where this node probes a server that listens on `listen` (a wildcard answers on loopback)."""
    if sglang_launch.is_wildcard(listen):
        return "::1" if ":" in listen else "127.0.0.1"
    return listen


def local_engines(plan: Plan, command: str | None, port: Callable[[], int] = free_port) -> list[Engine]:
    if not plan.deployment:
        raise ConfigError("the plan has no deployment: write it with `cascade optimize plan`")
    engines = []
    for d in plan.deployment:
        model = d.model or d.tier
        for replica in range(sum(s.count for s in d.sets())):
            p = port()
            name = f"{d.tier}-{replica}"
            if command is not None:
                argv = _from_template(command, port=p, model=model, tier=d.tier, replica=replica)
                engines.append(Engine(name=name, tier=d.tier, model=model, port=p, argv=argv, env=dict(os.environ)))
            else:
                engines.append(_embedded(name, d.tier, model, p))
    return engines


def _from_template(template: str, **values: object) -> list[str]:
    try:
        argv = [part.format(**values) for part in shlex.split(template)]
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"--engine-command: bad placeholder {exc}; use "
                          f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}") from None
    if not argv or shutil.which(argv[0]) is None:
        raise ConfigError(f"--engine-command: `{argv[0] if argv else ''}` is not an executable on PATH")
    return argv


def _embedded(name: str, tier: str, model: str, port: int) -> Engine:
    """`transformers serve` of an embedded CPU model (the plan's model names its card)."""
    from cascade.engines import models

    known = [c.name for c in models.all_cards()]
    if model not in known:
        raise ConfigError(f"tier `{tier}`: model `{model}` is not an embedded CPU model ({', '.join(known)}); "
                          "pass --engine-command to launch another engine per replica")
    card = models.load_card(model)
    directory = models.model_dir(card)
    config = WorkerConfig(name=name, model=model, port=port)
    # Served under its directory: `transformers serve` answers that id (as `cascade serve`'s workers).
    return Engine(name=name, tier=tier, model=str(directory), port=port, argv=worker_command(directory, port, config),
                  embedded=card.name)


def gateway_config(plan: Plan, engines: list[Engine]) -> str:
    return sglang_launch.gateway_config(plan.tiers, [(e.tier, e.kind, e.url, e.model) for e in engines],
                                        widths=sglang_launch.plan_widths(plan))


def render(engines: list[Engine], config_toml: str, api_key_env: str = DEFAULT_API_KEY_ENV) -> str:
    """The commands (an `--api-key` value shown as `"$api_key_env"`) and the config, which must hold no key."""
    lines = []
    for e in engines:
        env = {k: v for k, v in (e.env or {}).items() if k == "CUDA_VISIBLE_DEVICES"}
        prefix = "".join(f"{k}={v} " for k, v in env.items())
        argv = [f'"${api_key_env}"' if i and e.argv[i - 1] == "--api-key" else shlex.quote(a)
                for i, a in enumerate(e.argv)]
        lines.append(f"{prefix}{' '.join(argv)} &  # tier {e.tier}")
    return "\n".join([*lines, "", config_toml])


def run(engines: list[Engine], config_toml: str, config_out: Path, log_dir: Path, startup_timeout_s: float,
        max_restarts: int, say: Callable[[str], None], plan_path: str = "plan.json", private: bool = False) -> int:
    """Start and supervise the engines until SIGINT/SIGTERM; the config is written once all are healthy
    (a config left from an earlier run is removed first: it would point at dead ports). `private`: the
    config holds the engines' API key, so it and the engine logs are created with mode 0600."""
    from cascade.engines import models

    config_out.unlink(missing_ok=True)
    for card in sorted({e.embedded for e in engines if e.embedded}):  # fetch/convert/verify once (idempotent)
        models.prepare(models.load_card(card))
    workers: list[Worker] = [
        _EngineWorker(e, WorkerConfig(name=e.name, model=e.embedded or e.tier, port=e.port, max_restarts=max_restarts,
                                      startup_timeout_s=startup_timeout_s), log_dir) for e in engines]
    if private:  # SGLang logs its server_args, the API key among them: logs that only the owner reads
        for worker in workers:
            _private_log(worker.log_path)
    supervisor = Supervisor(workers)
    try:
        return asyncio.run(_supervise(supervisor, config_toml, config_out, say, plan_path, private))
    finally:
        supervisor.stop()  # idempotent; covers an exit through an exception


class _EngineWorker(Worker):
    """A Worker health-checked where its engine listens (an engine bound to its node's name does not
    answer on 127.0.0.1)."""

    def __init__(self, engine: Engine, config: WorkerConfig, log_dir: Path) -> None:
        super().__init__(config, Path(engine.model), log_dir, command=engine.argv, env=engine.env,
                         serves_http=engine.serves_http,
                         health_timeout_s=Timeouts().health_s if engine.kind == "sglang" else 2.0)
        self._url = engine.url

    @property
    def url(self) -> str:
        return self._url


def _private_log(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a log left from an earlier run keeps its mode otherwise
    finally:
        os.close(fd)


def _write_config(path: Path, text: str, private: bool) -> None:
    """Written beside `path`, then renamed onto it: whoever waits for the file never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.unlink(missing_ok=True)  # created 0600 from the start when private: the key is never readable by others
    with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666), "w") as out:
        out.write(text)
    os.replace(part, path)


async def _supervise(supervisor: Supervisor, config_toml: str, config_out: Path, say: Callable[[str], None],
                     plan_path: str, private: bool = False) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = asyncio.Event()

    async def engines_up() -> None:
        async with supervisor:  # stops every engine on any exit, a cancelled start included
            started.set()
            _write_config(config_out, config_toml, private)
            for worker in supervisor.workers:
                say(f"{worker.config.name}: {worker.url} (pid {worker.process.pid if worker.process else '?'})")
            say(f"{len(supervisor.workers)} engine(s) up; gateway config: {config_out}"
                f"{' (holds the engine API key; mode 0600)' if private else ''}. Run the gateway with "
                f"`cascade serve --config {config_out} --plan {plan_path}`. Ctrl-C (or SIGTERM) stops every engine.")
            await stop.wait()
            say("stopping the engines")

    running = asyncio.create_task(engines_up())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not started.is_set() and not running.done():  # a signal while the engines start: stop them
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            say("stopping before every engine was healthy")
            return 0
        await running  # a worker that failed to start raises here
        return 0
    finally:
        running.cancel()
        stopping.cancel()
        supervisor.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def setup_logging() -> None:
    """Starts, exits and restarts of the engines on stderr (not every health probe)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
