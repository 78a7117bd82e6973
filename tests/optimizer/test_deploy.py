"""SGLang placement: every GPU used once, replicas kept inside nodes, big replicas span nodes."""

from __future__ import annotations

import pytest

from cascade.engines.sglang_launch import launch_plan
from cascade.errors import ConfigError
from cascade.plan import Plan, ReplicaSet, TierDeployment


def plan(*deployments: TierDeployment, per_node: int = 8) -> Plan:
    return Plan(tiers=[d.tier for d in deployments], operating_points=[], deployment=list(deployments),
                gpus_per_node=per_node)


def test_no_gpu_is_given_to_two_servers() -> None:
    launch = launch_plan(plan(
        TierDeployment(tier="a", gpus=6, replicas=6, tp=1, model="m/a"),
        TierDeployment(tier="b", gpus=12, replicas=3, replica_sets=[ReplicaSet(tp=4, count=2), ReplicaSet(tp=2, count=2)]),
        TierDeployment(tier="c", gpus=6, replicas=1, tp=4),
    ))
    used = [(s.host, g) for s in launch.servers for g in s.gpus]
    assert len(used) == len(set(used)) == 6 + 12 + 4
    assert all(len({s.host for s in launch.servers if s.port == p and s.host == h}) == 1
               for h, p in {(s.host, s.port) for s in launch.servers})


def test_a_replica_larger_than_a_node_takes_whole_nodes_with_one_rendezvous() -> None:
    launch = launch_plan(plan(TierDeployment(tier="big", gpus=16, replicas=1, tp=8, pp=2, model="m/big")),
                         hosts=["gpu-a", "gpu-b"])
    ranks = sorted((s.node_rank, s.host) for s in launch.servers)
    assert ranks == [(0, "gpu-a"), (1, "gpu-b")]
    assert all("--nnodes 2" in s.command() and "--dist-init-addr gpu-a:" in s.command() for s in launch.servers)
    assert launch.config_toml.count("url =") == 1  # only rank 0 serves HTTP


def test_dp_per_server_merges_a_tiers_replicas_on_a_node() -> None:
    launch = launch_plan(plan(TierDeployment(tier="a", gpus=8, replicas=4, tp=2)), dp_per_server=True)
    assert len(launch.servers) == 1 and launch.servers[0].gpus == tuple(range(8))
    assert "--tp-size 2" in launch.servers[0].command() and "--dp-size 4" in launch.servers[0].command()


def test_too_few_hosts_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs 2"):
        launch_plan(plan(TierDeployment(tier="a", gpus=16, replicas=2, tp=8)), hosts=["only-one"])
