"""SGLang placement: every GPU used once, replicas kept inside nodes, big replicas span nodes; servers bind
loopback on one node and their node's name across nodes, and the gateway config points where they bind."""

from __future__ import annotations

import msgspec
import pytest

from cascade.deploy.launch import exposure_warning
from cascade.engines.sglang_launch import Server, launch_plan, render
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


def host_arg(server: Server, api_key: str = "") -> str:
    args = server.args(api_key)
    return args[args.index("--host") + 1]


def test_a_plan_on_one_node_binds_loopback_and_the_config_points_there() -> None:
    launch = launch_plan(plan(TierDeployment(tier="a", gpus=4, replicas=4, tp=1, model="m/a")))
    assert launch.hosts == ["127.0.0.1"]
    assert [host_arg(s) for s in launch.servers] == ["127.0.0.1"] * 4
    assert "0.0.0.0" not in render(launch)
    assert sorted(urls(launch.config_toml)) == [f"http://127.0.0.1:{30000 + i}" for i in range(4)]


def test_a_plan_across_nodes_binds_each_nodes_own_host_name() -> None:
    launch = launch_plan(plan(TierDeployment(tier="big", gpus=16, replicas=1, tp=8, pp=2, model="m/big"),
                              TierDeployment(tier="a", gpus=8, replicas=8, tp=1, model="m/a")),
                         hosts=["gpu-a", "gpu-b", "gpu-c"])
    assert {s.host for s in launch.servers} == {"gpu-a", "gpu-b", "gpu-c"}
    assert all(host_arg(s) == s.host for s in launch.servers)
    # The gateway config points at the names the rank-0 servers bind.
    assert sorted(urls(launch.config_toml)) == sorted(f"http://{s.host}:{s.port}" for s in launch.servers
                                                      if s.node_rank == 0)


@pytest.mark.parametrize(("hosts", "gpus", "reached"), [(None, 8, {"127.0.0.1"}), (["gpu-a", "gpu-b"], 16,
                                                                                   {"gpu-a", "gpu-b"})])
def test_engine_host_0_0_0_0_binds_every_interface_and_the_config_keeps_reachable_names(
        hosts: list[str] | None, gpus: int, reached: set[str]) -> None:
    launch = launch_plan(plan(TierDeployment(tier="a", gpus=gpus, replicas=gpus, tp=1, model="m/a")), hosts=hosts,
                         engine_host="0.0.0.0")
    assert {host_arg(s) for s in launch.servers} == {"0.0.0.0"}
    assert {url.split("//")[1].rsplit(":", 1)[0] for url in urls(launch.config_toml)} == reached


@pytest.mark.parametrize(("address", "url_host"), [("10.1.2.3", "10.1.2.3"), ("fd00::5", "[fd00::5]")])
def test_a_specific_engine_host_on_one_node_is_where_the_config_points(address: str, url_host: str) -> None:
    launch = launch_plan(plan(TierDeployment(tier="a", gpus=2, replicas=2, tp=1, model="m/a")), engine_host=address)
    assert [host_arg(s) for s in launch.servers] == [address] * 2
    assert sorted(urls(launch.config_toml)) == [f"http://{url_host}:30000", f"http://{url_host}:30001"]


def test_one_specific_engine_host_for_a_plan_across_nodes_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="spans 2 nodes"):
        launch_plan(plan(TierDeployment(tier="a", gpus=16, replicas=2, tp=8)), hosts=["gpu-a", "gpu-b"],
                    engine_host="10.1.2.3")


def test_the_api_key_is_in_the_launch_args_and_printed_commands_read_it_from_the_environment() -> None:
    launch = launch_plan(plan(TierDeployment(tier="a", gpus=2, replicas=2, tp=1, model="m/a")), api_key="${KEY}")
    server = launch.servers[0]
    assert server.args("s3cret")[server.args("s3cret").index("--api-key") + 1] == "s3cret"
    assert "--api-key" not in server.args()
    printed = render(launch, "KEY")
    assert printed.count('--api-key "$KEY"') == 2
    assert printed.count('api_key = "${KEY}"') == 2  # the config holds the placeholder it was given


def test_a_written_api_key_is_a_valid_toml_string() -> None:
    launch = launch_plan(plan(TierDeployment(tier="a", gpus=1, replicas=1, tp=1, model="m/a")),
                         api_key='k"e\\y')
    assert msgspec.toml.decode(launch.config_toml)["tiers"][0]["backends"][0]["api_key"] == 'k"e\\y'


@pytest.mark.parametrize(("binds", "api_key", "exposed"), [
    ({"127.0.0.1"}, False, None), ({"::1", "localhost", "127.0.0.2"}, False, None), ({"0.0.0.0"}, False, "0.0.0.0"),
    ({"gpu-b", "gpu-a", "127.0.0.1"}, False, "gpu-a, gpu-b"), ({"0.0.0.0"}, True, None),
])
def test_a_non_loopback_bind_without_an_api_key_is_warned_about_in_one_line(binds: set[str], api_key: bool,
                                                                             exposed: str | None) -> None:
    warning = exposure_warning(binds, api_key, "KEY")
    if exposed is None:
        assert warning is None
    else:
        assert warning is not None and "\n" not in warning
        assert f"bind {exposed}, reachable from the network, without an API key" in warning and "$KEY" in warning


def urls(config_toml: str) -> list[str]:
    return [b["url"] for t in msgspec.toml.decode(config_toml)["tiers"] for b in t["backends"]]
