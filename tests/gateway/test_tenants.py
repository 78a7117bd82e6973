"""API keys as tenants over real HTTP: `cascade keys add`, per-key rate limits (429 with OpenAI's headers), the hints
and tiers a key may use (403), per-key metrics; and the token buckets on a fake clock."""

from __future__ import annotations

import hashlib
import re

import httpx
import msgspec
import pytest
import uvicorn

from cascade.cli import main
from cascade.config import decode_config
from cascade.errors import ConfigError
from cascade.gateway import server
from cascade.schemas import ChatCompletionRequest
from cascade.service.keys.keyring import Keyring
from cascade.service.keys.ratelimit import LocalRateLimiter, duration
from cascade.service.keys.reservation import estimate_tokens
from cascade.testing.servers import TIERS, ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user

KEY = "csk-test-key"


def entry(name: str = "team-a", key: str = KEY, **fields: object) -> str:
    extra = "".join(f"{k} = {msgspec.json.encode(v).decode()}\n" for k, v in fields.items())
    return f'[[gateway.keys]]\nname = "{name}"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n{extra}'


def bearer(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_add_prints_a_key_once_whose_sha256_is_in_the_entry_the_gateway_accepts(tmp_path, capsys) -> None:
    assert main(["keys", "add", "--name", "team-a", "--rpm", "5", "--tpm", "1000", "--hints", "fast,best"]) == 0
    out = capsys.readouterr().out
    key, toml = out.split("\n", 1)
    assert re.fullmatch(r"csk-[A-Za-z0-9_-]{43}", key)
    assert f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"' in toml and key not in toml
    assert 'requests_per_minute = 5\ntokens_per_minute = 1000\nhints = ["fast", "best"]\n' in toml
    with running_gateway(extra=toml) as (base, _, _):
        allowed = post_chat(base, {"model": "cascade:fast", "messages": user()}, bearer(key))
        wrong = post_chat(base, {"model": "cascade:fast", "messages": user()}, bearer(key + "x"))
        missing = post_chat(base, {"model": "cascade:fast", "messages": user()})
    assert allowed.status_code == 200
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert missing.status_code == 401


def test_keys_add_write_appends_to_the_config_and_list_shows_names_never_keys(tmp_path, capsys) -> None:
    config = tmp_path / "cascade.toml"
    original = '[[tiers]]\nname = "small"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:9", model = "m" }]\n'
    config.write_text(original)
    assert main(["keys", "add", "--name", "ops", "--config", str(config), "--write", "--rpm", "7",
                 "--tiers", "small"]) == 0
    key = capsys.readouterr().out.split("\n", 1)[0]
    text = config.read_text()
    assert text.startswith(original) and hashlib.sha256(key.encode()).hexdigest() in text and key not in text
    assert main(["keys", "list", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "ops" in listed and "rpm=7 tpm=unlimited hints=all tiers=small" in listed and key not in listed


@pytest.mark.parametrize(("args", "message"), [
    (["--name", "a b"], "name must be a non-empty name"),
    (["--name", "a", "--hints", "quick"], "hints: unknown quick"),
    (["--name", "a", "--rpm", "-1"], "--rpm and --tpm must be >= 0"),
    (["--name", "a", "--write"], "--write needs --config"),
])
def test_keys_add_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    assert main(["keys", "add", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and captured.err.count("\n") == 1


def test_a_key_duplicated_in_the_config_is_refused_by_keys_add(tmp_path, capsys) -> None:
    config = tmp_path / "cascade.toml"
    config.write_text(entry("ops") + '[[tiers]]\nname = "s"\nbackends = [{ kind = "openai", url = "http://h:1", '
                      'model = "m" }]\n')
    assert main(["keys", "add", "--name", "ops", "--config", str(config), "--write"]) == 2
    assert "`ops` is used twice" in capsys.readouterr().err


def test_third_request_over_two_per_minute_is_429_with_openai_headers_and_error() -> None:
    with running_gateway(extra=entry(requests_per_minute=2)) as (base, _, _):
        first, second, third = (post_chat(base, {"model": "cascade", "messages": user()}, bearer()) for _ in range(3))
        metrics = httpx.get(f"{base}/metrics").text
    assert first.status_code == second.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2" and first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in first.headers  # no token limit set
    assert third.status_code == 429
    assert third.headers["retry-after"] == "30"  # one request back at 2 per minute
    assert third.headers["x-ratelimit-limit-requests"] == "2" and third.headers["x-ratelimit-remaining-requests"] == "0"
    assert re.fullmatch(r"(59\.\d+s|1m0s)", third.headers["x-ratelimit-reset-requests"])
    error = third.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded" and error["param"] is None
    assert "requests per min (RPM): Limit 2, Used 2, Requested 1" in error["message"]
    assert 'cascade_key_rate_limited_total{key="team-a",limit="requests"} 1.0' in metrics


def test_tokens_per_minute_reserves_max_tokens_and_settles_to_the_usage() -> None:
    body = {"model": "cascade", "messages": user(), "max_tokens": 80}
    reserved = estimate_tokens(msgspec.convert(body, ChatCompletionRequest))
    # The prompt's bound: its messages' JSON bytes and a chat template's own tokens (cascade/service/keys/reservation.py)
    assert reserved == len(msgspec.json.encode(msgspec.convert(body, ChatCompletionRequest).messages)) + 32 + 80
    with running_gateway(extra=entry(tokens_per_minute=300)) as (base, _, _):
        first = post_chat(base, body, bearer())
        # Reserved 80 + prompt, used 8 + 8 (the fake engine's usage): the bucket got the difference back.
        second = post_chat(base, {**body, "max_tokens": 70}, bearer())
        too_large = post_chat(base, {**body, "max_tokens": 250}, bearer())
        over = post_chat(base, {**body, "max_tokens": 225}, bearer())  # fits the limit, not what is left of it
    assert first.status_code == 200 and second.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "300"
    assert first.headers["x-ratelimit-remaining-tokens"] == str(300 - reserved)
    assert too_large.status_code == 429 and too_large.json()["error"]["type"] == "tokens"
    assert "Request too large" in too_large.json()["error"]["message"]
    assert over.status_code == 429 and over.json()["error"] == {
        "message": over.json()["error"]["message"], "type": "tokens", "param": None, "code": "rate_limit_exceeded"}
    assert "tokens per min (TPM): Limit 300" in over.json()["error"]["message"]
    assert int(over.headers["retry-after"]) >= 1 and over.headers["x-ratelimit-limit-tokens"] == "300"


def test_a_request_that_fails_before_an_answer_gets_its_tokens_back() -> None:
    body = {"model": TIERS[2], "messages": user(), "max_tokens": 80}
    with running_gateway(extra=entry(tokens_per_minute=200), dead_url="http://127.0.0.1:9") as (base, _, _):
        failed = post_chat(base, body, bearer())
        again = post_chat(base, {**body, "model": TIERS[0]}, bearer())
    assert failed.status_code >= 500
    assert again.status_code == 200  # 80 + the prompt's bound (67) twice would not fit in 200


def test_a_hint_or_tier_the_key_may_not_use_is_403_naming_what_it_may() -> None:
    with running_gateway(extra=entry(hints=["fast"], tiers=[TIERS[0]])) as (base, _, _):
        fast = post_chat(base, {"model": "cascade:fast", "messages": user()}, bearer())
        best = post_chat(base, {"model": "cascade:best", "messages": user()}, bearer())
        header = post_chat(base, {"model": "cascade", "messages": user()}, {**bearer(), "X-Cascade-Quality": "best"})
        numeric = post_chat(base, {"model": "cascade", "messages": user(), "quality": 0.5}, bearer())
        default = post_chat(base, {"model": "cascade", "messages": user()}, bearer())  # default hint: balanced
        own_tier = post_chat(base, {"model": TIERS[0], "messages": user()}, bearer())
        other_tier = post_chat(base, {"model": TIERS[2], "messages": user()}, bearer())
    assert fast.status_code == 200 and own_tier.status_code == 200
    for refused in (best, header, numeric, default):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["type"] == "permission_error"
        assert refused.json()["error"]["code"] == "permission_denied"
        assert refused.json()["error"]["message"].endswith("it may use: fast")
    assert other_tier.status_code == 403 and other_tier.json()["error"]["param"] == "model"
    assert f"it may use: {TIERS[0]}" in other_tier.json()["error"]["message"]


def test_metrics_count_requests_and_tokens_per_key_name_and_tier_never_the_key() -> None:
    extra = entry("team-a") + entry("team-b", key="csk-other", requests_per_minute=10)
    with running_gateway(extra=extra) as (base, _, _):
        for _ in range(2):
            assert post_chat(base, {"model": TIERS[1], "messages": user()}, bearer()).status_code == 200
        streamed = httpx.post(f"{base}/v1/chat/completions", headers=bearer("csk-other"), timeout=10,
                              json={"model": TIERS[0], "messages": user(), "stream": True})
        metrics = httpx.get(f"{base}/metrics").text
    assert streamed.status_code == 200 and streamed.headers["x-ratelimit-limit-requests"] == "10"
    assert f'cascade_key_requests_total{{key="team-a",tier="{TIERS[1]}"}} 2.0' in metrics
    assert f'cascade_key_tokens_total{{direction="in",key="team-a",tier="{TIERS[1]}"}} 16.0' in metrics
    assert f'cascade_key_tokens_total{{direction="out",key="team-a",tier="{TIERS[1]}"}} 16.0' in metrics
    # The stream settles when it ends.
    assert f'cascade_key_requests_total{{key="team-b",tier="{TIERS[0]}"}} 1.0' in metrics
    assert f'cascade_key_tokens_total{{direction="out",key="team-b",tier="{TIERS[0]}"}} 8.0' in metrics
    assert KEY not in metrics and hashlib.sha256(KEY.encode()).hexdigest() not in metrics


def test_plain_api_keys_still_work_as_unlimited_tenants() -> None:
    with running_gateway(extra='[gateway]\napi_keys = ["sekrit"]\n') as (base, _, _):
        ok = post_chat(base, {"model": TIERS[0], "messages": user()}, bearer("sekrit"))
        metrics = httpx.get(f"{base}/metrics").text
    assert ok.status_code == 200 and "x-ratelimit-limit-requests" not in ok.headers
    assert f'cascade_key_requests_total{{key="api_keys[0]",tier="{TIERS[0]}"}} 1.0' in metrics


def test_buckets_refill_at_the_limit_per_minute_and_settle_corrects_tokens() -> None:
    now = [0.0]
    limiter = LocalRateLimiter(clock=lambda: now[0])
    assert limiter.take("k", 60, 0, 0).refused is None  # 60/min: one a second
    for _ in range(59):
        limiter.take("k", 60, 0, 0)
    refused = limiter.take("k", 60, 0, 0)
    assert refused.refused == "requests" and refused.retry_after_s == pytest.approx(1.0)
    now[0] = 1.0
    assert limiter.take("k", 60, 0, 0).refused is None
    tokens = limiter.take("t", 0, 600, 500)
    assert tokens.tokens.remaining == 100 and tokens.requests.limit == 0
    limiter.settle("t", 600, reserved=500, used=100)
    assert limiter.take("t", 0, 600, 500).tokens.remaining == 0


@pytest.mark.parametrize(("seconds", "text"), [(0.25, "250ms"), (1.0, "1s"), (360.0, "6m0s"), (3723.0, "1h2m3s"),
                                                (1.5, "1.5s"), (0.0, "0ms")])
def test_reset_durations_read_as_openai_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_key_configured_twice_plain_or_hashed_stops_the_gateway_naming_both_entries() -> None:
    key = "csk-" + "k3y" * 10
    hashed = f'[[gateway.keys]]\nname = "team-a"\nsha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
    for extra, names in ((f'[gateway]\napi_keys = ["{key}", "{key}"]\n', ("api_keys[0]", "api_keys[1]")),
                         (f'[gateway]\napi_keys = ["{key}"]\n{hashed}', ("team-a", "api_keys[0]"))):
        config = decode_config(ladder_toml("http://127.0.0.1:9", extra))
        with pytest.raises(ConfigError, match="configured twice") as info:
            Keyring(config.gateway.keys, config.gateway.api_keys)
        assert all(f"`{name}`" in str(info.value) for name in names)


@pytest.mark.parametrize("key", ["change-me", "a" * 40, "abcabcabcabcabcabcabcabcabcabc"])
def test_a_weak_plain_key_stops_a_gateway_bound_beyond_loopback(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: started.append(options["host"]))  # nothing is bound
    config = decode_config(ladder_toml("http://127.0.0.1:9", f'[gateway]\napi_keys = ["{key}"]\n'))
    with pytest.raises(ConfigError, match=r"api_keys\[0\] in \[gateway\] api_keys: too easy to guess"):
        server.run(config, None, "0.0.0.0", 8000)
    server.run(config, None, "127.0.0.1", 8000)  # on loopback it is the operator's own business
    strong = decode_config(ladder_toml("http://127.0.0.1:9", '[gateway]\napi_keys = ["csk-Zq8vW2rT5yL0pN4mK7xB"]\n'))
    server.run(strong, None, "0.0.0.0", 8000)
    assert started == ["127.0.0.1", "0.0.0.0"]


def test_keys_add_writes_a_budget_the_gateway_reads_and_list_shows_it(tmp_path, capsys) -> None:
    config = tmp_path / "cascade.toml"
    config.write_text('[[tiers]]\nname = "small"\nprice = { input_per_mtok = 1, output_per_mtok = 2 }\n'
                      'backends = [{ kind = "openai", url = "http://127.0.0.1:9", model = "m" }]\n')
    assert main(["keys", "add", "--name", "ops", "--config", str(config), "--write", "--budget", "2.5",
                 "--budget-period", "day"]) == 0
    assert 'budget = 2.5\nbudget_period = "day"\n' in capsys.readouterr().out
    assert main(["keys", "list", "--config", str(config)]) == 0
    assert "budget=2.5/day" in capsys.readouterr().out
    assert main(["keys", "add", "--name", "a", "--budget", "nan"]) == 2
    assert "--budget must be between 0" in capsys.readouterr().err
    assert main(["keys", "add", "--name", "a", "--budget", "1", "--budget-period", "week"]) == 2
    assert "--budget-period must be hour, day, month" in capsys.readouterr().err


def test_v1_route_counts_against_the_keys_requests_per_minute_like_a_chat_request() -> None:
    """Routing costs CPU as a chat request's does (up to tens of ms for a long prompt): /v1/route takes one request
    from the key's bucket and a place while it decides, and past the limit it is a 429 like chat."""
    body = {"model": "cascade", "messages": user()}
    with running_gateway(extra=entry(requests_per_minute=2)) as (base, _, _):
        routed = [httpx.post(f"{base}/v1/route", json=body, headers=bearer(), timeout=10) for _ in range(2)]
        third = httpx.post(f"{base}/v1/route", json=body, headers=bearer(), timeout=10)
        chat = post_chat(base, body, bearer())
    assert [r.status_code for r in routed] == [200, 200]
    assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limit_exceeded"
    assert chat.status_code == 429  # the same bucket
