"""SGLang launch flags that change what a reasoning model's server returns: the output parsers from the
model card (without them no `reasoning_content`, no `tool_calls`) and deterministic inference where a
plan asks for reproducible branches (without it SGLang ignores `seed`)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from cascade import files
from cascade.deploy.launch import with_card_parsers
from cascade.engines.sglang_launch import Server, launch_plan
from cascade.engines.sglang_parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from cascade.errors import ConfigError
from cascade.optimizer import cards
from cascade.optimizer.planner import plan_problem
from cascade.optimizer.problem import load_problem
from cascade.plan import Plan, TierDeployment

R1_7B = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def plan(*deployments: TierDeployment) -> Plan:
    return Plan(tiers=[d.tier for d in deployments], operating_points=[], deployment=list(deployments),
                gpus_per_node=8)


def tier(name: str, model: str, **fields: object) -> TierDeployment:
    return TierDeployment(tier=name, gpus=1, replicas=1, tp=1, model=model, **fields)  # type: ignore[arg-type]


def flag(server: Server, name: str) -> str | None:
    args = server.args()
    return args[args.index(name) + 1] if name in args else None


def by_tier(p: Plan, **options: object) -> dict[str, Server]:
    return {s.tier: s for s in launch_plan(with_card_parsers(p), **options).servers}  # type: ignore[arg-type]


def test_every_card_names_only_parsers_sglang_accepts() -> None:
    for path in sorted(cards.GPU_MODEL_DIR.glob("*.toml")):
        card = cards.load_model(path.stem)
        assert card.reasoning_parser in REASONING_PARSERS | {""}
        assert card.tool_call_parser in TOOL_CALL_PARSERS | {""}
    assert cards.load_model("deepseek-r1-distill-qwen-7b").reasoning_parser == "deepseek-r1"
    assert cards.load_model("llama-3.1-70b").tool_call_parser == "llama3"


def test_a_card_with_parsers_gives_its_servers_the_flags_and_a_model_without_a_card_gets_none() -> None:
    servers = by_tier(plan(tier("r1", R1_7B), tier("llama", LLAMA_8B), tier("other", "org/unknown")))
    assert (flag(servers["r1"], "--reasoning-parser"), flag(servers["r1"], "--tool-call-parser")) == ("deepseek-r1", None)
    assert (flag(servers["llama"], "--reasoning-parser"), flag(servers["llama"], "--tool-call-parser")) == (None, "llama3")
    assert not {"--reasoning-parser", "--tool-call-parser"} & set(servers["other"].args())


def test_every_rank_of_a_multi_node_replica_and_a_dp_server_gets_the_flags() -> None:
    big = TierDeployment(tier="r1", gpus=16, replicas=1, tp=8, pp=2, model=R1_7B, deterministic=True)
    launch = launch_plan(with_card_parsers(plan(big)), hosts=["gpu-a", "gpu-b"])
    assert [s.node_rank for s in launch.servers] == [0, 1]
    assert all("--reasoning-parser deepseek-r1 --enable-deterministic-inference" in s.command() for s in launch.servers)
    merged = launch_plan(with_card_parsers(plan(TierDeployment(tier="r1", gpus=4, replicas=4, tp=1, model=R1_7B))),
                         dp_per_server=True)
    assert len(merged.servers) == 1 and flag(merged.servers[0], "--reasoning-parser") == "deepseek-r1"


@pytest.mark.parametrize("model", [
    "/models/DeepSeek-R1-Distill-Qwen-7B", "deepseek-r1-distill-qwen-7b", R1_7B,
])
def test_a_card_is_found_by_hf_id_card_name_or_a_local_checkpoint_directory(model: str) -> None:
    card = cards.served_card(model)
    assert card is not None and card.name == "deepseek-r1-distill-qwen-7b"


def test_the_plans_own_parsers_win_and_an_empty_one_means_none() -> None:
    servers = by_tier(plan(tier("r1", R1_7B, reasoning_parser="", tool_call_parser="deepseekv3"),
                           tier("q", "org/qwen3", reasoning_parser="qwen3")))
    assert "--reasoning-parser" not in servers["r1"].args() and flag(servers["r1"], "--tool-call-parser") == "deepseekv3"
    assert flag(servers["q"], "--reasoning-parser") == "qwen3"


def test_a_parser_sglang_does_not_know_is_a_config_error_naming_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"tier `r1`.*reasoning_parser `deepseek_r1` is not one SGLang 0\.5\.23 "
                                          r"accepts.*deepseek-r1.*qwen3"):
        launch_plan(plan(tier("r1", R1_7B, reasoning_parser="deepseek_r1")))
    with pytest.raises(ConfigError, match=r"tool_call_parser `llama3.1`.*--tool-call-parser.*llama3"):
        launch_plan(plan(tier("l", LLAMA_8B, tool_call_parser="llama3.1")))


def test_a_card_with_a_bad_parser_name_does_not_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((cards.GPU_MODEL_DIR / "llama-3.1-8b.toml").read_text().replace('"llama3"', '"llama"'))
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid GPU model card: .*tool_call_parser `llama`.*pythonic"):
        files.load(bad, cards.ModelCard, "GPU model card")


def test_deterministic_inference_only_where_the_plan_or_the_caller_asks_for_it() -> None:
    p = plan(tier("fast", LLAMA_8B), tier("sure", R1_7B, deterministic=True))
    servers = by_tier(p)
    assert "--enable-deterministic-inference" not in servers["fast"].args()
    assert "--enable-deterministic-inference" in servers["sure"].args()
    assert all("--enable-deterministic-inference" in s.args() for s in by_tier(p, deterministic=True).values())
    assert not any("--enable-deterministic-inference" in s.args() for s in by_tier(plan(tier("a", R1_7B))).values())


def test_the_planner_writes_the_cards_parsers_and_the_problems_determinism_into_the_plan(small_problem) -> None:
    text = small_problem.read_text().replace('model = "deepseek-r1-distill-qwen-32b"',
                                             'model = "deepseek-r1-distill-qwen-32b"\ndeterministic = true')
    small_problem.write_text(text)
    problem, base = load_problem(small_problem)
    written = msgspec.json.decode(msgspec.json.encode(plan_problem(problem, base).plan), type=Plan)
    small, large = written.deployment
    assert (small.reasoning_parser, small.tool_call_parser, small.deterministic) == ("", "llama3", False)
    assert (large.reasoning_parser, large.tool_call_parser, large.deterministic) == ("deepseek-r1", "", True)
    servers = {s.tier: s for s in launch_plan(written).servers}
    assert flag(servers["small"], "--tool-call-parser") == "llama3"
    assert "--enable-deterministic-inference" in servers["large"].args()
