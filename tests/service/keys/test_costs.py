"""Cost per request (cascade/service/keys/costs.py): `[tiers.price]` checked with numbers, a GPU-hour turned into per-token
prices from a plan and a profile, every response's `cascade.cost` priced from its bill per tier (branches, escalated
drafts and streams included), the `x-cascade-cost` header, and the cost metrics per tier and key.

ChatService runs in front of the fake engine over real HTTP on 127.0.0.1 (tests/service/test_lease.py's setup)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cascade.config import decode_config, load_config
from cascade.errors import ConfigError
from cascade.optimizer.profile import DecodeModel, DecodePoint, PrefillModel, Profile, write_profile
from cascade.plan import OperatingPoint, Plan, ReplicaSet, TierDeployment
from cascade.schemas import ChatCompletion
from cascade.service.chat import ChatService, ServiceConfig, StreamReply, WholeReply
from cascade.service.keys.costs import MTOK, Prices, TokenPrice, cost_header, tier_prices
from cascade.service.keys.tenant import Tenant
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user
from tests.service.pricing import PRICES, expected, last_chunk, priced, running_priced_gateway
from tests.service.test_lease import request, with_service

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def caller(name: str = "acme") -> Tenant:
    return Tenant(name, hashlib.sha256(name.encode()).digest())


def priced_service(work, *, mode: str = "route", extra: str = "", **kwargs):
    return with_service(work, mode=mode, extra=extra, rewrite=priced, **kwargs)


# --- [tiers.price]: every mistake is one line naming its key --------------------------------------------------


@pytest.mark.parametrize(("price", "message"), [
    ("{ input_per_mtok = nan, output_per_mtok = 1 }", "Expected `float` >= 0.0 in `tiers[0].price.input_per_mtok`"),
    ("{ input_per_mtok = 1, output_per_mtok = inf }", "<= 1000000.0"),
    ("{ input_per_mtok = 1e300, output_per_mtok = 1 }", "<= 1000000.0"),
    ("{ input_per_mtok = -0.5, output_per_mtok = 1 }", ">= 0.0"),
    ("{ input_per_mtok = 1 }", "`tiers[0].price.output_per_mtok` is missing"),
    ("{ input_per_mtok = 1, output_per_mtok = 1, gpu_hour = 2 }", "sets both per-token prices and `gpu_hour`"),
    ("{ gpu_hour = 2 }", "`tiers[0].price.gpu_hour` needs `profile`"),
    ("{ gpu_hour = 1e9, profile = \"p.json\" }", "<= 10000.0"),
    ("{ input_per_mtok = 1, output_per_mtok = 1, profile = \"p.json\" }", "read with `gpu_hour` only"),
    ("{ currency = \"USD\" }", "needs input_per_mtok and output_per_mtok"),
    ("{ input_per_mtok = 1, output_per_mtok = 1, currency = \"US D\" }", "currency"),
    ("{ input_per_mtok = 1, output_per_mtok = 1, per_token = 3 }", "unknown key `per_token`"),
])
def test_a_bad_price_is_one_config_error_naming_its_key(price: str, message: str) -> None:
    toml = priced(ladder_toml("http://127.0.0.1:9")).replace(
        'price = { input_per_mtok = 1.0, output_per_mtok = 2.0, currency = "USD" }', f"price = {price}", 1)
    with pytest.raises(ConfigError) as error:
        decode_config(toml)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_every_tier_is_priced_or_none_and_in_one_currency() -> None:
    toml = priced(ladder_toml("http://127.0.0.1:9"))
    with pytest.raises(ConfigError, match=r"`tiers\[1\]\.price` is missing: once one tier has a price every tier"):
        decode_config(toml.replace("price = { input_per_mtok = 10.0, output_per_mtok = 20.0, currency = \"USD\" }\n",
                                   ""))
    with pytest.raises(ConfigError, match=r"currency` differs between tiers \(EUR, USD\)"):
        decode_config(toml.replace('20.0, currency = "USD"', '20.0, currency = "EUR"'))
    assert tier_prices(decode_config(ladder_toml("http://127.0.0.1:9"))) is None


@pytest.mark.parametrize(("fields", "message"), [
    ("budget = 5.0", "`gateway.keys[0].budget` needs prices to count it"),
    ("budget = nan", "Expected `float` >= 0.0"),
    ("budget = 1e13", "<= 1000000000000.0"),
    ("budget = 5.0\nbudget_period = \"week\"", "Invalid enum value 'week'"),
    ("budget = 5.0\nbudget_period = 0", "Expected `int` >= 1"),
    ("budget = 5.0\nbudget_period = 40000000", "<= 31622400"),
    ("downgrade_at = 0.9", "set `budget` too"),
    ("budget = 5.0\ndowngrade_at = 1.0", "< 1.0"),
    ("budget = 5.0\ndowngrade_at = 0.9\ndowngrade_to = \"cheapest\"", "`gateway.keys[0].downgrade_to` is 'cheapest'"),
    ("budget = 5.0\ndowngrade_at = 0.9\nhints = [\"best\"]", "is hint `fast`, which the key may not use"),
    (f"budget = 5.0\ndowngrade_at = 0.9\ndowngrade_to = \"{TIERS[0]}\"\ntiers = [\"{TIERS[2]}\"]",
     f"is tier `{TIERS[0]}`, which the key may not use"),
])
def test_a_bad_budget_is_one_config_error_naming_its_key(fields: str, message: str) -> None:
    key = f'[[gateway.keys]]\nname = "a"\nsha256 = "{"0" * 64}"\n{fields}\n'
    toml = ladder_toml("http://127.0.0.1:9", key)
    if "needs prices" not in message:
        toml = priced(toml)
    with pytest.raises(ConfigError) as error:
        decode_config(toml)
    assert message in str(error.value) and "\n" not in str(error.value)


# --- a GPU-hour, from the plan's GPUs and the engine's measured throughput ----------------------------------------


def write_gpu_priced(tmp_path: Path, *, tp: int = 2, gpus: int = 4, replicas: int = 2) -> tuple[Path, Plan]:
    """A config whose top tier costs 3.6 per GPU-hour (0.001 per GPU-second), profiled on tp=2: prefill 1e-4 s a
    token (10,000 tokens/s), decode at best 64 sequences a 0.02 s step (3,200 tokens/s)."""
    profile = Profile(model="m", tp=2, prefill=PrefillModel(fixed_s=0.02, per_token_s=1e-4),
                      decode=DecodeModel(fixed_s=0.01, per_sequence_s=1e-4),
                      decode_points=[DecodePoint(batch=1, step_s=0.01, context_tokens=100),
                                     DecodePoint(batch=64, step_s=0.02, context_tokens=100)])
    write_profile(tmp_path / "profiles" / "big.json", profile)
    toml = priced(ladder_toml("http://127.0.0.1:9")).replace(
        'price = { input_per_mtok = 100.0, output_per_mtok = 200.0, currency = "USD" }',
        'price = { gpu_hour = 3.6, profile = "profiles/big.json" }')
    (tmp_path / "cascade.toml").write_text(toml)
    plan = Plan(tiers=list(TIERS), operating_points=[OperatingPoint(hint="balanced", thresholds=[0.3, 0.6])],
                deployment=[TierDeployment(tier=TIERS[2], gpus=gpus, replicas=replicas, tp=tp,
                                           replica_sets=[ReplicaSet(tp=tp, count=replicas)])])
    return tmp_path / "cascade.toml", plan


def test_a_gpu_hour_is_priced_per_token_from_the_plans_gpus_and_the_profiles_throughput(tmp_path: Path) -> None:
    config_path, plan = write_gpu_priced(tmp_path)
    prices = ServiceConfig.of(load_config(config_path), plan).prices  # the profile's path is the config's folder's
    assert prices is not None
    top = prices.tiers[TIERS[2]]
    # 2 GPUs a replica (4 on 2) at 0.001 per GPU-second: 0.002 a second, over 10,000 and 3,200 tokens a second.
    assert top.input == pytest.approx(0.002 / 10_000) and top.output == pytest.approx(0.002 / 3_200)
    assert prices.tiers[TIERS[0]] == TokenPrice(input=1.0 / MTOK, output=2.0 / MTOK)


@pytest.mark.parametrize(("case", "message"), [
    ("no plan", "needs the plan's GPUs for tier `tier-large`: serve with --plan"),
    ("tier not in the plan", "needs the plan's GPUs for tier `tier-large`"),
    ("another shape", "was measured on tp=2 pp=1, the plan runs tier `tier-large` on tp=4 pp=1"),
    ("no profile", "cannot read profile"),
    ("no decode points", "has no measured decode throughput"),
    ("no prefill rate", "has no measured prefill rate"),
])
def test_a_gpu_hour_without_its_sources_is_one_config_error(tmp_path: Path, case: str, message: str) -> None:
    config_path, plan = write_gpu_priced(tmp_path, tp=4 if case == "another shape" else 2)
    profile_path = tmp_path / "profiles" / "big.json"
    if case == "tier not in the plan":
        plan = msgspec.structs.replace(plan, deployment=[])
    elif case == "no profile":
        profile_path.unlink()
    elif case in ("no decode points", "no prefill rate"):
        data = msgspec.json.decode(profile_path.read_bytes())
        if case == "no decode points":
            data["decode_points"] = []
        else:
            data["prefill"]["per_token_s"] = 0.0
        profile_path.write_bytes(msgspec.json.encode(data))
    with pytest.raises(ConfigError) as error:
        ServiceConfig.of(load_config(config_path), None if case == "no plan" else plan)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert "`tiers[2].price.gpu_hour`" in str(error.value) or str(profile_path) in str(error.value)


# --- every response carries its cost ---------------------------------------------------------------------------


def cost_of(completion: ChatCompletion) -> float:
    assert completion.cascade is not None and completion.cascade.cost is not None
    assert completion.cascade.cost.currency == "USD"
    return completion.cascade.cost.total


def test_a_whole_answer_costs_its_bill_at_its_tiers_price_and_the_metrics_count_it() -> None:
    async def work(service: ChatService):
        reply = await service.chat(request(model=TIERS[1]), caller=caller())
        assert isinstance(reply, WholeReply)
        info = reply.completion.cascade
        assert info is not None and info.billed is not None and info.cost is not None
        series = (service.metrics.cost.labels(TIERS[1])._value.get(),
                  service.metrics.key_cost.labels("acme", TIERS[1])._value.get())
        return info.billed, info.cost, series

    billed, cost, (tier_series, key_series) = priced_service(work)
    assert cost.input == pytest.approx(billed.prompt_tokens * 10 / MTOK)
    assert cost.output == pytest.approx(billed.completion_tokens * 20 / MTOK)
    assert cost.total == pytest.approx(cost.input + cost.output) and cost.total > 0
    assert tier_series == pytest.approx(cost.total) and key_series == pytest.approx(cost.total)


def test_every_branch_is_priced_pruned_and_stopped_ones_included() -> None:
    async def work(service: ChatService):
        req = request(model=TIERS[2], branches={"n": 4, "m": 2}, messages=user("[fake@fake-2 itl_ms=2] 2+2?"))
        reply = await service.chat(req, caller=caller())
        assert isinstance(reply, WholeReply) and reply.completion.cascade is not None
        return reply.completion.cascade.billed, cost_of(reply.completion), reply.completion.usage

    billed, total, usage = priced_service(work)
    assert billed.completion_tokens > usage.completion_tokens  # the branches decoded more than the answer
    assert total == pytest.approx(expected({TIERS[2]: (billed.prompt_tokens, billed.completion_tokens)}))


def test_an_escalated_draft_is_priced_at_its_own_tier_beside_the_answer_that_replaced_it() -> None:
    async def work(service: ChatService):
        req = request(model="cascade:balanced", messages=user("[fake@fake-0 tokens=100] What is 2 + 2?"))
        reply = await service.chat(req, caller=caller())
        assert isinstance(reply, WholeReply) and reply.completion.model == TIERS[1]
        assert reply.completion.usage is not None and reply.completion.cascade is not None
        assert reply.completion.cascade.cost is not None
        return reply.completion.usage.prompt_tokens, cost_of(reply.completion), reply.completion.cascade.cost.tiers

    prompt, total, by_tier = priced_service(work, mode="cascade")
    # The draft: its prompt and 32 tokens (cut at max_tokens) on the first tier; the answer: 8 on the second.
    assert total == pytest.approx(expected({TIERS[0]: (prompt, 32), TIERS[1]: (prompt, 8)}))
    assert by_tier == pytest.approx({TIERS[0]: expected({TIERS[0]: (prompt, 32)}),
                                     TIERS[1]: expected({TIERS[1]: (prompt, 8)})})  # each tier's share


def test_a_streams_last_chunk_carries_its_cost() -> None:
    async def work(service: ChatService):
        reply = await service.chat(request(model=TIERS[0], stream=True, stream_options={"include_usage": True}))
        assert isinstance(reply, StreamReply)
        frames = [reply.first, *[frame async for frame in reply.frames]]
        await reply.frames.aclose()
        return last_chunk(b"".join(frames)), service.metrics.cost.labels(TIERS[0])._value.get()

    last, series = priced_service(work)
    billed, cost = last["cascade"]["billed"], last["cascade"]["cost"]
    assert last["usage"] is not None and cost["currency"] == "USD"
    assert cost["total"] == pytest.approx(expected({TIERS[0]: (billed["prompt_tokens"], billed["completion_tokens"])}))
    assert series == pytest.approx(cost["total"])  # no key: the tier's series counts it all the same


def test_a_whole_response_carries_its_cost_header_and_unpriced_tiers_carry_none() -> None:
    body = {"model": TIERS[0], "messages": user()}
    with running_gateway() as (base, _, _):
        plain = post_chat(base, body)
    assert "x-cascade-cost" not in plain.headers and plain.json()["cascade"].get("cost") is None
    with running_priced_gateway() as base:
        paid, streamed = post_chat(base, body), post_chat(base, {**body, "stream": True})
    cost = paid.json()["cascade"]["cost"]
    assert cost["total"] > 0 and "e" not in paid.headers["x-cascade-cost"]
    assert math.isclose(float(paid.headers["x-cascade-cost"]), cost["total"], rel_tol=1e-9)
    assert "x-cascade-cost" not in streamed.headers  # a stream's cost is known at its end: its last chunk
    assert last_chunk(streamed.content)["cascade"]["cost"]["total"] > 0


# --- the arithmetic, on hostile counts --------------------------------------------------------------------------


counts = st.integers(min_value=0, max_value=2**40)
per_mtok = st.floats(min_value=0, max_value=1_000_000, allow_nan=False)


@PROPERTY
@given(bill=st.dictionaries(st.sampled_from(TIERS), st.tuples(counts, counts), max_size=3),
       prices=st.lists(st.tuples(per_mtok, per_mtok), min_size=3, max_size=3))
def test_a_cost_is_finite_non_negative_and_the_sum_of_its_tiers(bill, prices) -> None:
    table = Prices(currency="USD", tiers={t: TokenPrice(input=i / MTOK, output=o / MTOK)
                                          for t, (i, o) in zip(TIERS, prices, strict=True)})
    cost = table.cost(bill)
    assert all(math.isfinite(x) and x >= 0 for x in (cost.input, cost.output, cost.total))
    assert cost.total == pytest.approx(sum(table.by_tier(bill).values()), rel=1e-9, abs=1e-9)
    assert math.isfinite(float(cost_header(cost))) and b"e" not in cost_header(cost)


@PROPERTY
@given(prompt=counts, output=counts, tier=st.sampled_from(TIERS), used_prompt=counts, used_output=counts)
def test_the_worst_case_bounds_any_bill_within_the_reservation(prompt, output, tier, used_prompt,
                                                                used_output) -> None:
    table = Prices(currency="USD", tiers={t: TokenPrice(input=i / MTOK, output=o / MTOK)
                                          for t, (i, o) in zip(TIERS, PRICES, strict=True)})
    bill = {tier: (min(prompt, used_prompt), min(output, used_output))}
    assert table.cost(bill).total <= table.worst_case(TIERS, prompt, output) * (1 + 1e-12) + 1e-12
