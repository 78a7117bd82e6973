"""SGLang launch commands for a plan's deployment (reads plan.json only; no optimizer import).

Placement: replicas are packed first-fit-decreasing by size onto nodes of `gpus_per_node` GPUs; a
replica that fits in a node never straddles two (TP wants NVLink), and a larger one takes whole
nodes (`--nnodes`, one command per node, rank 0 serves HTTP). Each replica is its own server with
its own port and CUDA_VISIBLE_DEVICES, so the gateway balances replicas itself; `dp_per_server`
instead merges a tier's same-shape replicas on a node into one server with `--dp-size`.

Binding: a plan on one node (no `hosts`) binds 127.0.0.1; with `hosts`, each server binds its own
node's name, the address the gateway config points at. `engine_host` overrides the bind address: a
wildcard (0.0.0.0, ::) listens on every interface while the gateway config keeps the node names
(127.0.0.1 on one node); any other address must be a one-node plan's, and the config points at it.
The API key is never part of a plan: callers pass it (or a placeholder) to `launch_plan`/`Server.args`.

Output: a tier's `reasoning_parser` / `tool_call_parser` become `--reasoning-parser` / `--tool-call-parser`
(SGLang returns `reasoning_content` and `tool_calls` only with them; names checked against
cascade/engines/sglang_parsers.py), and `deterministic` adds `--enable-deterministic-inference` (SGLang
honours a request's `seed` only with it). A parser left unset (None) in the plan is none here: `cascade
deploy` fills it from the model card first.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
from dataclasses import dataclass

from cascade.engines.sglang_parsers import check_parser
from cascade.errors import ConfigError
from cascade.plan import Plan, TierDeployment

DIST_PORT_OFFSET = 1000  # torch.distributed rendezvous port = HTTP port + this, for multi-node replicas


@dataclass(frozen=True)
class Server:
    tier: str
    model: str
    host: str
    port: int
    gpus: tuple[int, ...]  # CUDA device ids on `host`
    tp: int
    pp: int = 1
    dp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str = ""
    bind: str = ""  # the address it listens on (`--host`); "": its node's name `host`
    reasoning_parser: str = ""  # "": none (SGLang then returns the thinking inside `content`)
    tool_call_parser: str = ""  # "": none (SGLang then returns tool calls as text)
    deterministic: bool = False  # --enable-deterministic-inference: `seed` honoured, reproducible answers

    @property
    def listen(self) -> str:
        return self.bind or self.host

    @property
    def url(self) -> str:
        """Where the gateway reaches it: the address it binds, or its node's name when it binds every interface."""
        return f"http://{url_host(self.host if is_wildcard(self.listen) else self.listen)}:{self.port}"

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))

    def args(self, api_key: str = "") -> list[str]:
        """The arguments of `python -m sglang.launch_server`; `api_key` adds `--api-key` (SGLang then requires
        `Authorization: Bearer <key>` on every route but /health and /metrics)."""
        args = ["--model-path", self.model, "--host", self.listen, "--port", str(self.port), "--tp-size", str(self.tp)]
        if self.pp > 1:
            args += ["--pp-size", str(self.pp)]
        if self.dp > 1:
            args += ["--dp-size", str(self.dp)]
        if self.nnodes > 1:
            args += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                     "--dist-init-addr", self.dist_init_addr]
        if self.reasoning_parser:
            args += ["--reasoning-parser", self.reasoning_parser]
        if self.tool_call_parser:
            args += ["--tool-call-parser", self.tool_call_parser]
        if self.deterministic:
            args.append("--enable-deterministic-inference")
        if api_key:
            args += ["--api-key", api_key]
        return [*args, "--enable-metrics"]

    def command(self, api_key_env: str = "") -> str:
        """A shell command line; with `api_key_env`, the key is the shell's `"$NAME"`, never its value."""
        return " ".join([f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}", "python -m sglang.launch_server",
                         *self.args(f'"${api_key_env}"' if api_key_env else "")])


@dataclass(frozen=True)
class Launch:
    servers: list[Server]
    hosts: list[str]
    config_toml: str


@dataclass(frozen=True)
class _Output:
    """A tier's output settings, the same on each of its servers."""

    reasoning_parser: str = ""
    tool_call_parser: str = ""
    deterministic: bool = False


def _output(d: TierDeployment, deterministic: bool) -> _Output:
    for key in ("reasoning_parser", "tool_call_parser"):
        check_parser(key, getattr(d, key) or "", f"tier `{d.tier}` ({d.model or d.tier})")
    return _Output(d.reasoning_parser or "", d.tool_call_parser or "", deterministic or d.deterministic)


@dataclass
class _Replica:
    tier: str
    model: str
    tp: int
    pp: int
    output: _Output = _Output()

    @property
    def size(self) -> int:
        return self.tp * self.pp


def launch_plan(plan: Plan, hosts: list[str] | None = None, base_port: int = 30000, dp_per_server: bool = False,
                engine_host: str | None = None, api_key: str = "", deterministic: bool = False) -> Launch:
    """Without `hosts`: 127.0.0.1 for a plan on one node, placeholders node-0, node-1, ... for a plan that
    spans nodes. `api_key` (the key, or a placeholder for printing) goes into the gateway config.
    `deterministic`: every tier's servers get --enable-deterministic-inference, not only the plan's."""
    if not plan.deployment:
        raise ConfigError("the plan has no deployment: write it with `cascade optimize plan`")
    per_node = plan.gpus_per_node or 8
    outputs = {d.tier: _output(d, deterministic) for d in plan.deployment}
    replicas = [_Replica(d.tier, d.model or d.tier, s.tp, s.pp, outputs[d.tier]) for d in plan.deployment
                for s in d.sets() for _ in range(s.count)]
    n_nodes = math.ceil(sum(d.gpus for d in plan.deployment) / per_node)
    hosts = hosts or (["127.0.0.1"] if n_nodes <= 1 else [f"node-{i}" for i in range(n_nodes)])
    if len(hosts) < n_nodes:
        raise ConfigError(f"--hosts names {len(hosts)} nodes; the plan needs {n_nodes} of {per_node} GPUs")
    if engine_host is not None:
        _check_engine_host(engine_host, n_nodes)
    placed = _place(replicas, len(hosts), per_node)
    servers = _servers(placed, hosts, base_port, dp_per_server)
    if engine_host:
        servers = [dataclasses.replace(s, bind=engine_host) for s in servers]
    return Launch(servers=servers, hosts=hosts, config_toml=_gateway_config(plan, servers, api_key))


def _check_engine_host(address: str, n_nodes: int) -> None:
    if not address or any(c.isspace() for c in address) or "/" in address:
        raise ConfigError(f"--engine-host {address!r} is not an address: pass a host name or IP, e.g. 127.0.0.1 "
                          "or 0.0.0.0")
    if n_nodes > 1 and not is_wildcard(address):
        raise ConfigError(f"--engine-host {address}: the plan spans {n_nodes} nodes and one address cannot be "
                          "every node's; leave it out (each node binds its own name in --hosts) or pass 0.0.0.0")


def is_wildcard(address: str) -> bool:
    """An address that listens on every interface (0.0.0.0, ::)."""
    try:
        return ipaddress.ip_address(address.strip("[]")).is_unspecified
    except ValueError:
        return False


def is_loopback(address: str) -> bool:
    """Literal loopback only (127.0.0.0/8, ::1, localhost); a host name is taken as reachable from the network."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _place(replicas: list[_Replica], n_nodes: int, per_node: int) -> list[tuple[_Replica, list[tuple[int, list[int]]]]]:
    """Each replica with its (node, GPU ids) pieces."""
    free = [list(range(per_node)) for _ in range(n_nodes)]
    placed = []
    for replica in sorted(replicas, key=lambda r: -r.size):
        if replica.size > per_node:
            if replica.size % per_node:
                raise ConfigError(f"tier `{replica.tier}`: a {replica.size}-GPU replica does not fill whole "
                                  f"{per_node}-GPU nodes")
            whole = [n for n in range(n_nodes) if len(free[n]) == per_node][: replica.size // per_node]
            if len(whole) < replica.size // per_node:
                raise ConfigError(f"tier `{replica.tier}`: not enough empty nodes for a {replica.size}-GPU replica")
            pieces = [(n, free[n][:]) for n in whole]
            for n in whole:
                free[n] = []
        else:
            node = next((n for n in range(n_nodes) if len(free[n]) >= replica.size), None)
            if node is None:
                raise ConfigError(f"tier `{replica.tier}`: no node has {replica.size} free GPUs left (fragmented)")
            pieces = [(node, free[node][: replica.size])]
            free[node] = free[node][replica.size:]
        placed.append((replica, pieces))
    return placed


def _servers(placed: list[tuple[_Replica, list[tuple[int, list[int]]]]], hosts: list[str], base_port: int,
             dp_per_server: bool) -> list[Server]:
    next_port = dict.fromkeys(range(len(hosts)), base_port)
    servers: list[Server] = []
    if dp_per_server:
        merged: dict[tuple[str, int, int, int], list[int]] = {}
        models = {}
        for replica, pieces in placed:
            if len(pieces) == 1:
                key = (replica.tier, pieces[0][0], replica.tp, replica.pp)
                merged.setdefault(key, []).extend(pieces[0][1])
                models[key] = replica
        for (tier, node, tp, pp), gpus in merged.items():
            port = next_port[node]
            next_port[node] += 1
            first = models[(tier, node, tp, pp)]
            servers.append(Server(tier, first.model, hosts[node], port, tuple(gpus), tp, pp,
                                  dp=len(gpus) // (tp * pp), **dataclasses.asdict(first.output)))
        placed = [(r, p) for r, p in placed if len(p) > 1]
    for replica, pieces in placed:
        head = pieces[0][0]
        port = next_port[head]
        for n, _ in pieces:
            next_port[n] = max(next_port[n], port + 1)
        for rank, (node, gpus) in enumerate(pieces):
            servers.append(Server(replica.tier, replica.model, hosts[node], port, tuple(gpus), replica.tp, replica.pp,
                                  nnodes=len(pieces), node_rank=rank,
                                  dist_init_addr=f"{hosts[head]}:{port + DIST_PORT_OFFSET}" if len(pieces) > 1 else "",
                                  **dataclasses.asdict(replica.output)))
    return sorted(servers, key=lambda s: (hosts.index(s.host), s.port, s.node_rank))


def _gateway_config(plan: Plan, servers: list[Server], api_key: str = "") -> str:
    return gateway_config(plan.tiers, [(s.tier, "sglang", s.url, s.model) for s in servers if s.node_rank == 0],
                          api_key, widths=plan_widths(plan))


def plan_widths(plan: Plan) -> dict[str, tuple[int, int, int]]:
    return {d.tier: (d.branches, d.branches_to_finish, d.first_wave) for d in plan.deployment}


def gateway_config(tiers: list[str], backends: list[tuple[str, str, str, str]], api_key: str = "",
                   widths: dict[str, tuple[int, int, int]] | None = None) -> str:
    """cascade.toml with one [[tiers]] per plan tier; backends are (tier, kind, url, model), each with
    `api_key` when one is given (cascade.toml has no way to read it from the environment); `widths`:
    the reasoning branches (N, M, first wave) the plan chose per tier, written where N > 1. A voting tier with
    several backends picks replicas by prefix (`[tiers.replicas] choice = "prefix"`): one request's branches, all
    one prompt, then share a replica while loads allow, so the vote waits on one batch and one prefill is cached
    (docs/measured.md, arm p of the goodput benchmark)."""
    lines = ["# cascade.toml for this deployment; run: cascade serve --config cascade.toml --plan plan.json", ""]
    key = f", api_key = {json.dumps(api_key, ensure_ascii=False)}" if api_key else ""
    for tier in tiers:
        lines += ["[[tiers]]", f'name = "{tier}"']
        n, m, first = (widths or {}).get(tier, (1, 1, 0))
        if n > 1 and first:
            lines += [f"branches = {{ n = {n}, m = {m}, first_wave = {first} }}  # planned width: {first} branches "
                      f"first, all {n} where they disagree, the first {m} to finish vote"]
        elif n > 1:
            lines += [f"branches = {{ n = {n}, m = {m} }}  # planned width: N branches, the first M to finish vote"]
        if n > 1 and sum(owner == tier for owner, *_ in backends) > 1:
            lines += ['replicas = { choice = "prefix" }  # a vote\'s branches share a replica while loads allow']
        lines += ["backends = ["]
        for owner, kind, url, model in backends:
            if owner == tier:
                lines.append(f'  {{ kind = "{kind}", url = "{url}", model = "{model}"{key} }},')
        lines += ["]", ""]
    return "\n".join(lines)


def render(launch: Launch, api_key_env: str = "") -> str:
    """Every node's commands and the gateway config. With `api_key_env`, the commands read the key from
    that variable, and the config (launched with a `${NAME}` placeholder) says how to fill it in."""
    out = []
    for host in launch.hosts:
        mine = [s for s in launch.servers if s.host == host]
        if not mine:
            continue
        out.append(f"# {host}")
        out += [f"{s.command(api_key_env)} &  # tier {s.tier}" for s in mine]
        out.append("")
    config = launch.config_toml
    if api_key_env:
        head, _, rest = config.partition("\n")
        config = (f"{head}\n# api_key: ${{{api_key_env}}} stands for the key; cascade.toml does not read the "
                  f"environment, so fill it in (e.g. envsubst '${api_key_env}') and keep the file private\n{rest}")
    out.append(config)
    return "\n".join(out)
