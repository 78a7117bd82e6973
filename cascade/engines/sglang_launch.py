"""SGLang launch commands for a plan's deployment (reads plan.json only; no optimizer import).

Placement: replicas are packed first-fit-decreasing by size onto nodes of `gpus_per_node` GPUs; a
replica that fits in a node never straddles two (TP wants NVLink), and a larger one takes whole
nodes (`--nnodes`, one command per node, rank 0 serves HTTP). Each replica is its own server with
its own port and CUDA_VISIBLE_DEVICES, so the gateway balances replicas itself; `dp_per_server`
instead merges a tier's same-shape replicas on a node into one server with `--dp-size`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cascade.errors import ConfigError
from cascade.plan import Plan

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

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))

    def args(self) -> list[str]:
        """The arguments of `python -m sglang.launch_server`."""
        args = ["--model-path", self.model, "--host", "0.0.0.0", "--port", str(self.port), "--tp-size", str(self.tp)]
        if self.pp > 1:
            args += ["--pp-size", str(self.pp)]
        if self.dp > 1:
            args += ["--dp-size", str(self.dp)]
        if self.nnodes > 1:
            args += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                     "--dist-init-addr", self.dist_init_addr]
        return [*args, "--enable-metrics"]

    def command(self) -> str:
        return " ".join([f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}", "python -m sglang.launch_server",
                         *self.args()])


@dataclass(frozen=True)
class Launch:
    servers: list[Server]
    hosts: list[str]
    config_toml: str


@dataclass
class _Replica:
    tier: str
    model: str
    tp: int
    pp: int

    @property
    def size(self) -> int:
        return self.tp * self.pp


def launch_plan(plan: Plan, hosts: list[str] | None = None, base_port: int = 30000,
                dp_per_server: bool = False) -> Launch:
    if not plan.deployment:
        raise ConfigError("the plan has no deployment: write it with `cascade optimize plan`")
    per_node = plan.gpus_per_node or 8
    replicas = [_Replica(d.tier, d.model or d.tier, s.tp, s.pp) for d in plan.deployment for s in d.sets()
                for _ in range(s.count)]
    n_nodes = math.ceil(sum(d.gpus for d in plan.deployment) / per_node)
    hosts = hosts or [f"node-{i}" for i in range(n_nodes)]
    if len(hosts) < n_nodes:
        raise ConfigError(f"--hosts names {len(hosts)} nodes; the plan needs {n_nodes} of {per_node} GPUs")
    placed = _place(replicas, len(hosts), per_node)
    servers = _servers(placed, hosts, base_port, dp_per_server)
    return Launch(servers=servers, hosts=hosts, config_toml=_gateway_config(plan, servers))


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
                models[key] = replica.model
        for (tier, node, tp, pp), gpus in merged.items():
            port = next_port[node]
            next_port[node] += 1
            servers.append(Server(tier, models[(tier, node, tp, pp)], hosts[node], port, tuple(gpus), tp, pp,
                                  dp=len(gpus) // (tp * pp)))
        placed = [(r, p) for r, p in placed if len(p) > 1]
    for replica, pieces in placed:
        head = pieces[0][0]
        port = next_port[head]
        for n, _ in pieces:
            next_port[n] = max(next_port[n], port + 1)
        for rank, (node, gpus) in enumerate(pieces):
            servers.append(Server(replica.tier, replica.model, hosts[node], port, tuple(gpus), replica.tp, replica.pp,
                                  nnodes=len(pieces), node_rank=rank,
                                  dist_init_addr=f"{hosts[head]}:{port + DIST_PORT_OFFSET}" if len(pieces) > 1 else ""))
    return sorted(servers, key=lambda s: (hosts.index(s.host), s.port, s.node_rank))


def _gateway_config(plan: Plan, servers: list[Server]) -> str:
    return gateway_config(plan.tiers, [(s.tier, "sglang", f"http://{s.host}:{s.port}", s.model)
                                       for s in servers if s.node_rank == 0])


def gateway_config(tiers: list[str], backends: list[tuple[str, str, str, str]]) -> str:
    """cascade.toml with one [[tiers]] per plan tier; backends are (tier, kind, url, model)."""
    lines = ["# cascade.toml for this deployment; run: cascade serve --config cascade.toml --plan plan.json", ""]
    for tier in tiers:
        lines += ["[[tiers]]", f'name = "{tier}"', "backends = ["]
        for owner, kind, url, model in backends:
            if owner == tier:
                lines.append(f'  {{ kind = "{kind}", url = "{url}", model = "{model}" }},')
        lines += ["]", ""]
    return "\n".join(lines)


def render(launch: Launch) -> str:
    out = []
    for host in launch.hosts:
        mine = [s for s in launch.servers if s.host == host]
        if not mine:
            continue
        out.append(f"# {host}")
        out += [f"{s.command()} &  # tier {s.tier}" for s in mine]
        out.append("")
    out.append(launch.config_toml)
    return "\n".join(out)
