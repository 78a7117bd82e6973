"""The model picker: headers and body in, the tier and the rewritten request (or the gateway's OpenAI error) out.
The decision is `cascade serve`'s own: the same config, the same hints, the same router, the same refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json

import msgspec
import pytest

from cascade.config import decode_config
from cascade.errors import ConfigError
from cascade.extproc.engines import tier_engines
from cascade.extproc.picker import Refused, Routed, TierPicker, Verdict
from cascade.plan import Plan
from cascade.service.keys.budgets import LocalLedger
from cascade.service.keys.ratelimit import LocalRateLimiter
from tests.extproc.extproc_setup import TOML, chat

KEY = "csk-test-key"


def picker(extra: str = "", *, gateway: bool = False, toml: str = TOML) -> TierPicker:
    return TierPicker(decode_config(extra + toml), gateway=gateway)


def pick(p: TierPicker, body: bytes, path: str = "/v1/chat/completions", method: str = "POST",
         **headers: str) -> Verdict:
    fields = {":path": path, ":method": method, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return asyncio.run(p.pick(fields, body))


def routed(verdict: Verdict) -> tuple[Routed, dict]:
    assert isinstance(verdict, Routed), verdict
    return verdict, json.loads(verdict.body)


def refused(verdict: Verdict, status: int) -> dict:
    assert isinstance(verdict, Refused), verdict
    assert verdict.status == status, verdict
    error = json.loads(verdict.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_fast_hint_routes_to_the_cheapest_tier_with_its_engine_model_and_no_cascade_fields() -> None:
    verdict, body = routed(pick(picker(), chat(quality="fast", temperature=0.2)))
    assert verdict.tier == "small" and not verdict.via_gateway
    assert dict(verdict.set_headers)["x-cascade-tier"] == "small"
    assert dict(verdict.set_headers)["content-length"] == str(len(verdict.body))
    assert body == {"model": "m-small", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                    "max_tokens": 64, "temperature": 0.2}  # the tier's default max_tokens, as the gateway sends


@pytest.mark.parametrize(("fields", "headers"), [
    ({"quality": "best"}, {}),
    ({}, {"x_cascade_quality": "best"}),
    ({"model": "cascade:best"}, {}),
    ({"model": "large"}, {}),  # a tier named as the model: pinned, as in the gateway
])
def test_best_from_the_body_the_header_the_model_alias_or_the_tier_name_reaches_the_top_tier(
        fields: dict, headers: dict) -> None:
    verdict, body = routed(pick(picker(), chat(**fields), **headers))
    assert verdict.tier == "large" and body["model"] == "m-large"


def test_the_engines_credentials_replace_the_clients_and_a_tier_without_them_gets_none() -> None:
    large, _ = routed(pick(picker(), chat(quality="best"), authorization="Bearer client"))
    assert dict(large.set_headers)["authorization"] == "Bearer sk-engine"
    small, _ = routed(pick(picker(), chat(quality="fast"), authorization="Bearer client"))
    assert "authorization" in small.remove_headers and "authorization" not in dict(small.set_headers)


def test_the_tiers_system_prompt_comes_first_and_the_clients_own_length_and_stream_are_kept() -> None:
    verdict, body = routed(pick(picker(), chat(model="medium", max_completion_tokens=7, stream=True,
                                               stream_options={"include_usage": True})))
    assert verdict.tier == "medium" and body["model"] == ""  # SGLang's default model, as the gateway sends it
    assert body["messages"][0] == {"role": "system", "content": "Think step by step."}
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_a_requests_chat_template_reaches_only_an_engine_whose_tier_trusts_it() -> None:
    kwargs = {"chat_template": "{{ messages }}", "enable_thinking": False}
    _, body = routed(pick(picker(), chat(model="medium", chat_template_kwargs=kwargs)))
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    _, body = routed(pick(picker(), chat(model="medium", chat_template_kwargs={"chat_template": "x"})))
    assert "chat_template_kwargs" not in body
    trusting = TOML.replace('name = "medium"', 'name = "medium"\ntrust_request_chat_template = true')
    _, body = routed(pick(picker(toml=trusting), chat(model="medium", chat_template_kwargs=kwargs)))
    assert body["chat_template_kwargs"] == kwargs


@pytest.mark.parametrize(("body", "status", "param", "code"), [
    (b"{not json", 400, None, "invalid_json"),
    (b"", 400, None, "invalid_json"),
    (chat(quality="fastest"), 400, "quality", None),
    (chat(temperature=3), 400, "temperature", None),
    (chat(surprise=1), 400, "surprise", "invalid_type"),
    (chat(model="gpt-9"), 404, "model", "model_not_found"),
    (chat(top_logprobs=10**9), 400, "top_logprobs", None),  # the gateway's bounds on what reaches an engine
    (chat(logit_bias={str(t): 1 for t in range(301)}), 400, "logit_bias", None),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}] * 129), 400, "tools", None),
    (chat(messages=[{"role": "user", "content": "x" * 2_000_000}]), 413, None, "request_too_large"),
])
def test_a_bad_request_gets_the_gateways_status_and_openai_error(body: bytes, status: int, param: str | None,
                                                                  code: str | None) -> None:
    error = refused(pick(picker(), body), status)
    assert (error["param"], error["code"]) == (param, code)


def test_another_method_is_405_and_another_path_is_left_alone() -> None:
    verdict = pick(picker(), b"", method="GET")
    assert refused(verdict, 405) and isinstance(verdict, Refused) and ("allow", "POST") in verdict.headers
    assert pick(picker(), b"", path="/v1/models", method="GET") is None


@pytest.mark.parametrize(("path", "plain"), [
    ("/v1/chat/%63ompletions", "/v1/chat/completions"),
    ("//v1/chat/./completions?x=%63", "/v1/chat/completions?x=%63"),
])
def test_another_spelling_of_the_chat_path_is_decided_and_routed_on_the_plain_one(path: str, plain: str) -> None:
    verdict, _ = routed(pick(picker(), chat(quality="fast"), path=path))
    assert dict(verdict.set_headers)[":path"] == plain  # Envoy's routes match the chat path exactly
    plain_verdict, _ = routed(pick(picker(), chat(quality="fast")))
    assert ":path" not in dict(plain_verdict.set_headers)
    assert pick(picker(), chat(), path="/v1/chat%2Fcompletions") is None  # no normal form: the gateway's 400


def test_api_keys_are_checked_as_the_gateway_checks_them() -> None:
    keyed = picker(f'[gateway]\napi_keys = ["{KEY}"]\n')
    assert refused(pick(keyed, chat()), 401)["type"] == "authentication_error"
    verdict, _ = routed(pick(keyed, chat(quality="fast"), authorization=f"Bearer {KEY}"))
    assert "authorization" in verdict.remove_headers  # the gateway's key never reaches an engine


def test_a_keys_limits_hold_a_forbidden_hint_is_403_and_past_its_rpm_429_with_retry_after() -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    keyed = picker(f'[[gateway.keys]]\nname = "team"\nsha256 = "{digest}"\nrequests_per_minute = 1\n'
                   'hints = ["fast"]\n')
    auth = {"authorization": f"Bearer {KEY}"}
    assert refused(pick(keyed, chat(quality="best"), **auth), 403)["param"] == "quality"
    routed(pick(keyed, chat(quality="fast"), **auth))
    verdict = pick(keyed, chat(quality="fast"), **auth)
    assert refused(verdict, 429)["code"] == "rate_limit_exceeded"
    assert isinstance(verdict, Refused) and "retry-after" in dict(verdict.headers)


def test_a_keys_budget_is_charged_each_requests_worst_case_and_refused_once_spent() -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    prices = {"small": "{ input_per_mtok = 1, output_per_mtok = 2 }",
              "medium": "{ input_per_mtok = 10, output_per_mtok = 20 }",
              "large": "{ input_per_mtok = 100, output_per_mtok = 200 }"}
    toml = TOML
    for tier, price in prices.items():
        toml = toml.replace(f'name = "{tier}"\n', f'name = "{tier}"\nprice = {price}\n')
    # Each fast request reserves its prompt's bound (78 tokens: cascade/service/keys/reservation.py) and 64 tokens on
    # `small`: about 2.1e-4; a budget of 5e-4 takes 3.
    keyed = picker(f'[[gateway.keys]]\nname = "team"\nsha256 = "{digest}"\nbudget = 5e-4\n', toml=toml)
    auth = {"authorization": f"Bearer {KEY}"}
    verdicts = [pick(keyed, chat(quality="fast"), **auth) for _ in range(4)]
    assert [isinstance(v, Routed) for v in verdicts] == [True, True, True, False]
    error = refused(verdicts[-1], 429)
    assert error["type"] == error["code"] == "insufficient_quota" and "API key `team`" in error["message"]
    # The budget and what the picker reserved of it are on its /metrics (the Envoy deployment's only view of them).
    text = keyed.metrics.render().decode()
    assert 'cascade_key_budget{key="team"} 0.0005' in text
    spent = next(line for line in text.splitlines() if line.startswith('cascade_key_budget_spent{key="team"}'))
    assert 3 * 2e-4 < float(spent.split()[-1]) < 5e-4 + 2.2e-4  # three admitted: within one worst case past it
    assert 'cascade_key_rate_limited_total{key="team",limit="budget"} 1.0' in text


def test_a_picker_requests_reservations_go_through_the_lease_and_are_given_back_exactly_once_on_every_exit() -> None:
    """The picker charges through the request's lease (ChatService.charge): sent to an engine, the key keeps its
    reservation (tokens and worst-case cost) and holds no place; refused by its budget after its tokens were
    reserved, those tokens come back, once; refused before any reservation, or sent to the gateway, nothing moves."""
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    toml = TOML.replace('name = "small"\n', 'name = "small"\nprice = { input_per_mtok = 1, output_per_mtok = 2 }\n')
    toml = toml.replace('name = "medium"\n', 'name = "medium"\nprice = { input_per_mtok = 1, output_per_mtok = 2 }\n')
    toml = toml.replace('name = "large"\n', 'name = "large"\nprice = { input_per_mtok = 1, output_per_mtok = 2 }\n')
    # A budget that admits one fast request (its worst case ~2.1e-4 passes the budget) and refuses the next.
    keyed = picker(f'[[gateway.keys]]\nname = "team"\nsha256 = "{digest}"\nbudget = 1e-4\ntokens_per_minute = 100000\n'
                   'max_in_flight = 1\nhints = ["fast", "balanced", "best"]\n', gateway=True, toml=toml)
    service = keyed.service
    service.tenants.limiter = LocalRateLimiter(clock=lambda: 0.0)  # no refill between the reads
    service.budgets.ledger = ledger = LocalLedger(clock=lambda: 0.0)
    auth = {"authorization": f"Bearer {KEY}"}

    def standing() -> tuple[float, float]:
        tokens = service.tenants.limiter.take("team", 0, 100_000, 0).tokens.remaining
        return tokens, ledger.read("team", 0).spent  # 0: the calendar month, the default period

    def nothing_held() -> bool:
        return not service.tenants.in_flight and service.admission.in_flight == 0 and not any(
            service.admission.tier_load)

    assert standing() == (100_000, 0.0)
    refused(pick(keyed, chat(quality="numeric-nonsense"), **auth), 400)  # before any reservation
    routed(pick(keyed, chat(quality="best", branches={"n": 2}), **auth))  # to the gateway: it charges
    assert standing() == (100_000, 0.0) and nothing_held()

    first, _ = routed(pick(keyed, chat(quality="fast"), **auth))
    assert not first.via_gateway
    tokens, spent = standing()
    assert tokens < 100_000 and spent > 0 and nothing_held()  # kept as the charge; no in-flight place held
    after_admitted = standing()
    assert refused(pick(keyed, chat(quality="fast"), **auth), 429)["code"] == "insufficient_quota"
    assert standing() == after_admitted and nothing_held()  # the refused request's tokens came back, once


def test_branches_go_to_the_gateway_pinned_to_the_picked_tier_or_are_refused_without_one() -> None:
    branched = chat(quality="best", branches={"n": 2})
    assert refused(pick(picker(), branched), 400)["param"] == "branches"
    verdict, body = routed(pick(picker(gateway=True), branched))
    assert verdict.via_gateway and dict(verdict.set_headers)["x-cascade-via"] == "gateway"
    assert body["model"] == "large" and body["branches"] == {"n": 2}  # the gateway serves that tier, no re-routing


def test_a_tier_that_runs_branches_is_served_by_the_gateway_when_there_is_one() -> None:
    toml = TOML.replace('name = "large"', 'name = "large"\nbranches = { n = 3 }\nscorer = "none"')
    verdict, _ = routed(pick(picker(toml=toml, gateway=True), chat(quality="best")))
    assert verdict.via_gateway and verdict.tier == "large"
    assert not routed(pick(picker(toml=toml, gateway=True), chat(quality="fast")))[0].via_gateway


def test_config_operating_points_pick_the_tier_and_a_cascade_mode_config_still_routes() -> None:
    extra = '[routing]\nmode = "cascade"\noperating_points = { balanced = [0.0, 1.5] }\n'
    verdict, _ = routed(pick(picker(extra), chat(quality="balanced")))
    assert verdict.tier == "medium"  # any difficulty >= 0 passes the first threshold, none reaches 1.5


def test_a_cascade_mode_plan_is_refused() -> None:
    plan = msgspec.convert({"tiers": ["small", "medium", "large"], "routing": "cascade", "operating_points": []},
                           Plan)
    with pytest.raises(ConfigError, match="cascade mode"):
        TierPicker(decode_config(TOML), plan)


@pytest.mark.parametrize(("backends", "match"), [
    ('[{ kind = "worker", worker = "w" }]', "embedded worker"),
    ('[{ kind = "openai", url = "http://a:1", model = "x" }, { kind = "openai", url = "http://b:1", model = "y" }]',
     "interchangeable"),
    ('[{ kind = "openai", url = "http://a:1/v1", model = "x" }, { kind = "openai", url = "http://b:1", model = "x" }]',
     "interchangeable"),
])
def test_a_tier_envoy_cannot_balance_as_one_cluster_is_a_config_error(backends: str, match: str) -> None:
    workers = '[[workers]]\nname = "w"\nmodel = "qwen2.5-0.5b"\n' if "worker" in backends else ""
    config = decode_config(f'{workers}[[tiers]]\nname = "only"\nbackends = {backends}\n')
    with pytest.raises(ConfigError, match=match):
        tier_engines(config)


def test_each_tier_is_one_cluster_of_its_backends_hosts() -> None:
    small, medium, large = tier_engines(decode_config(TOML))
    assert [(e.host, e.port) for e in medium.endpoints] == [("127.0.0.1", 9102), ("127.0.0.1", 9103)]
    assert (medium.prefix, medium.tls, small.prefix) == ("/engine", False, "")
    assert large.tls and large.endpoints[0].port == 8443 and large.authorization == "Bearer sk-engine"
    assert len({small.cluster, medium.cluster, large.cluster}) == 3


def test_a_request_for_the_gateway_is_left_to_the_gateways_own_key_limits_so_it_counts_once() -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    keyed = picker(f'[[gateway.keys]]\nname = "team"\nsha256 = "{digest}"\nrequests_per_minute = 1\n', gateway=True)
    auth = {"authorization": f"Bearer {KEY}"}
    for _ in range(2):  # two, past the key's one per minute: the gateway behind counts them, not the picker
        verdict, _ = routed(pick(keyed, chat(quality="best", branches={"n": 2}), **auth))
        assert verdict.via_gateway and "authorization" not in verdict.remove_headers  # the gateway checks the key
    routed(pick(keyed, chat(quality="fast"), **auth))
    assert refused(pick(keyed, chat(quality="fast"), **auth), 429)
    assert refused(pick(keyed, chat(quality="fast")), 401)


def test_prompt_cache_key_picks_a_gateways_replica_and_never_reaches_an_engine() -> None:
    _, body = routed(pick(picker(), chat(quality="fast", prompt_cache_key="session-1")))
    assert "prompt_cache_key" not in body  # read by cascade ([tiers.replicas]), not an engine's field
    _, body = routed(pick(picker(gateway=True), chat(quality="best", branches={"n": 2}, prompt_cache_key="s-1")))
    assert body["prompt_cache_key"] == "s-1"  # the gateway behind chooses the tier's replica by it


def test_the_effort_routes_as_in_the_gateway_and_reaches_the_engine_as_the_tier_sends_it() -> None:
    """`reasoning_effort` is a hint below the cascade ones; the engine body carries it at the top level (the nested
    form is read, not sent), with the thinking switch and the tier's budget in its engine's own field."""
    budgeted = TOML.replace('name = "medium"', 'name = "medium"\nthinking = { budget_tokens = { high = 512 } }')
    verdict, body = routed(pick(picker(toml=budgeted), chat(reasoning={"effort": "high"})))
    assert verdict.tier == "large" and body["reasoning_effort"] == "high" and "reasoning" not in body
    assert body["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True}
    verdict, body = routed(pick(picker(toml=budgeted), chat(reasoning_effort="high", quality="fast")))
    assert verdict.tier == "small"  # the explicit hint comes first
    _, body = routed(pick(picker(toml=budgeted), chat(model="medium", reasoning_effort=0.9)))
    assert (body["reasoning_effort"], body["custom_params"]) == (0.9, {"thinking_budget": 512})  # SGLang's own
    assert refused(pick(picker(), chat(reasoning_effort="loads")), 400)["param"] == "reasoning_effort"
