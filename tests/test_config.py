"""cascade.toml decoding: good configs load, every mistake names its key."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from cascade.config import (
    BranchSettings,
    BrokenRule,
    CascadeConfig,
    OpenAIBackendConfig,
    RandomSplitConfig,
    Timeouts,
    WorkerBackendConfig,
    check_branches,
    decode_config,
    load_config,
)
from cascade.engines.embedded import embedded_config
from cascade.errors import ConfigError
from cascade.testing.servers import ladder_toml

MINIMAL = """
[[tiers]]
name = "small"
backends = [{ kind = "openai", url = "http://127.0.0.1:9000", model = "m" }]
"""


def test_minimal_config_gets_safe_defaults() -> None:
    config = decode_config(MINIMAL)
    assert config.gateway.host == "127.0.0.1"
    assert config.gateway.limits.max_n == 8
    assert isinstance(config.tiers[0].backends[0], OpenAIBackendConfig)


def test_engine_health_is_probed_in_the_background_by_default_leaving_sglang_its_own_timeout() -> None:
    health = decode_config(MINIMAL).gateway.health
    assert health.enabled and (health.interval_s, health.unhealthy_after, health.healthy_after) == (2.0, 2, 1)
    assert health.timeout_s >= Timeouts().health_s  # an SGLang probe (a one-token generation) is cut by its own limit
    tuned = decode_config(MINIMAL + "\n[gateway.health]\ninterval_s = 0.5\ntimeout_s = 3\nunhealthy_after = 3\n")
    assert (tuned.gateway.health.interval_s, tuned.gateway.health.timeout_s) == (0.5, 3.0)


def test_embedded_default_is_a_four_tier_ladder_topped_by_a_greedy_and_a_sampling_15b_worker() -> None:
    config = embedded_config()
    assert [t.name for t in config.tiers] == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b",
                                              "qwen2.5-coder-1.5b-reason"]
    assert {w.model for w in config.workers} == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    assert config.tiers[-1].branches.n > 1
    assert all(isinstance(b, WorkerBackendConfig) for t in config.tiers for b in t.backends)
    workers = {w.name: w for w in config.workers}
    reasoning, direct = config.tiers[-1].backends[0], config.tiers[-2].backends[0]
    assert isinstance(reasoning, WorkerBackendConfig) and isinstance(direct, WorkerBackendConfig)
    # The engine decodes every request as its worker is set: sampled branches need their own worker.
    assert workers[reasoning.worker].temperature == config.tiers[-1].branches.temperature > 0
    assert workers[direct.worker].temperature == 0


WORKER_LADDER = """
[[workers]]
name = "w"
model = "smollm2-135m"
{worker}

[[tiers]]
name = "thinker"
backends = [{{ kind = "worker", worker = "w" }}]

[tiers.branches]
n = 4
m = 2
{tier}
"""


@pytest.mark.parametrize(("worker", "tier", "message"), [
    ("", "", r"runs 4 branches on worker `w`, which decodes greedily.*temperature = 0.7"),
    ("temperature = 0.7", "temperature = 1.0", r"tiers\[0\].branches.temperature` \(1\) differs from worker `w`'s"),
    ("temperature = 3", "", r"workers\[0\].temperature"),
    ("top_p = 0", "", r"workers\[0\].top_p"),
])
def test_a_branched_tier_needs_a_worker_sampling_at_its_branch_temperature(worker, tier, message) -> None:
    with pytest.raises(ConfigError, match=message):
        decode_config(WORKER_LADDER.format(worker=worker, tier=tier))


def test_a_branched_tier_on_a_sampling_worker_loads() -> None:
    config = decode_config(WORKER_LADDER.format(worker="temperature = 0.7\ntop_p = 0.9", tier=""))
    assert (config.workers[0].temperature, config.workers[0].top_p) == (0.7, 0.9)


def test_example_sglang_config_loads() -> None:
    config = load_config("examples/sglang-gpu.toml")
    assert len(config.tiers) >= 3


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (MINIMAL + "\n[gateway]\nprot = 1\n", "unknown key `prot` in `gateway`"),
        (MINIMAL.replace('model = "m"', 'model = "m", colour = 1'), "unknown key `colour` in `tiers[0].backends[0]`"),
        (MINIMAL + "\n[gateway]\nport = 70000\n", "gateway.port"),
        (MINIMAL + "\n[gateway.limits]\nmax_n = 0\n", "gateway.limits.max_n"),
        (MINIMAL.replace('kind = "openai"', 'kind = "grpc"'), "tiers[0].backends[0]"),
        (MINIMAL.replace("http://", "ftp://"), "tiers[0].backends[0].url"),
        ("[gateway]\nport = 1\n", "`tiers` is empty"),
        (MINIMAL + MINIMAL, "unique"),
        (MINIMAL.replace('{ kind = "openai", url = "http://127.0.0.1:9000", model = "m" }',
                         '{ kind = "worker", worker = "nope" }'), "tiers[0].backends[0].worker"),
        (MINIMAL + '\n[routing.operating_points]\nfast = [0.5]\n', "routing.operating_points.fast"),
        ("[[tiers]\n", "not valid TOML"),
        ('[gateway]\napi_keys = ["k1", ""]\n' + MINIMAL, "gateway.api_keys[1]` is empty"),
        ('[gateway]\napi_keys = ["two words"]\n' + MINIMAL, "gateway.api_keys[0]"),
        ('[[gateway.keys]]\nname = "a"\nsha256 = "sekrit"\n' + MINIMAL, "gateway.keys[0]`.sha256 must be the 64"),
        (f'[[gateway.keys]]\nname = "a b"\nsha256 = "{"0" * 64}"\n' + MINIMAL, "gateway.keys[0]`.name"),
        (f'[[gateway.keys]]\nname = "a"\nsha256 = "{"0" * 64}"\n[[gateway.keys]]\nname = "a"\nsha256 = "{"1" * 64}"\n'
         + MINIMAL, "gateway.keys[1]`.name `a` is used twice"),
        (f'[[gateway.keys]]\nname = "a"\nsha256 = "{"0" * 64}"\nhints = ["quick"]\n' + MINIMAL,
         "gateway.keys[0]`.hints: unknown quick"),
        (f'[[gateway.keys]]\nname = "a"\nsha256 = "{"0" * 64}"\ntiers = ["big"]\n' + MINIMAL,
         "gateway.keys[0]`.tiers: unknown big"),
        (f'[[gateway.keys]]\nname = "a"\nsha256 = "{"0" * 64}"\nrequests_per_minute = -1\n' + MINIMAL,
         "gateway.keys[0].requests_per_minute"),
        (MINIMAL + '\n[routing.confidence]\nsource = "votes"\n', "routing.confidence.source"),
        (MINIMAL + '\n[routing.confidence]\ncalibration = { big = [1.0, 0.0] }\n', "names ['big'], which are not"),
        (MINIMAL + '\n[routing.confidence]\ncalibration = { small = [-1.0, 0.0] }\n', "slope must be > 0"),
        (MINIMAL.replace('model = "m" }', 'model = "m", unsupported_params = ["logprobs"] }')
         + "[tiers.branches]\nprune_confidence = 0.5\n", "tiers[0].branches.prune_confidence` needs token logprobs"),
        (MINIMAL + "[tiers.branches]\nprune_confidence = 1.5\n", "tiers[0].branches.prune_confidence` must be in"),
        (MINIMAL.replace('model = "m" }', 'model = "m", unsupported_params = ["logprobs"] }')
         + "[tiers.branches]\nn = 4\nm = 4\nfirst_wave = 2\nconfidence_keep = 0.9\n",
         "tiers[0].branches.confidence_keep` needs token logprobs"),
        (MINIMAL.replace('model = "m" }', 'model = "m", unsupported_params = ["top_logprobs"] }')
         + '[tiers.branches]\naggregation = "confidence"\n', "tiers[0].branches.aggregation` needs token logprobs"),
        (MINIMAL + "[tiers.branches]\nn = 4\nm = 4\nconfidence_keep = 0.9\n",
         "`tiers[0].branches.confidence_keep` needs first_wave"),
        (MINIMAL + "[tiers.branches]\nn = 2\nm = 3\n", "`tiers[0].branches.m` must be between 1 and n (2)"),
        (MINIMAL + "[tiers.branches]\nn = 4\nm = 3\nfirst_wave = 3\n", "`tiers[0].branches.first_wave` must be 0"),
        (MINIMAL + "[tiers.branches]\nn = 4\nwave_margin = 2\n", "`tiers[0].branches.wave_margin` needs first_wave"),
        (MINIMAL + "[tiers.branches]\nn = 4\nslots = 2\n", "`tiers[0].branches.slots` (2) must be 0"),
        (MINIMAL + "[tiers.branches]\nn = 1.5\n", "in `tiers[0].branches.n`"),
        (MINIMAL + "[tiers.branches]\nN = 4\n", "unknown key `N` in `tiers[0].branches`"),
        (MINIMAL + '\n[gateway.redis]\nurl = "http://x"\n', "`gateway.redis.url` must start with redis://"),
        (MINIMAL + '\n[gateway.redis]\nfailure = "ajar"\n', "in `gateway.redis.failure`"),
        (MINIMAL + "\n[gateway.redis]\ntimeout_s = 0\n", "in `gateway.redis.timeout_s`"),
        (MINIMAL + '\n[gateway.tracing]\nendpoint = "127.0.0.1:4318"\n', "`gateway.tracing.endpoint` must be an OTLP"),
        (MINIMAL + "\n[gateway.tracing]\nsampler_ratio = 1.5\n", "in `gateway.tracing.sampler_ratio`"),
        (MINIMAL + '\n[gateway.tracing]\nservice_name = ""\n', "in `gateway.tracing.service_name`"),
        (MINIMAL + "\n[gateway.health]\ninterval_s = 0\n", "gateway.health.interval_s"),
        (MINIMAL + "\n[gateway.health]\ninterval_s = 301\n", "gateway.health.interval_s"),
        (MINIMAL + "\n[gateway.health]\ntimeout_s = 0\n", "gateway.health.timeout_s"),
        (MINIMAL + "\n[gateway.health]\ntimeout_s = 601\n", "gateway.health.timeout_s"),
        (MINIMAL + "\n[gateway.health]\nunhealthy_after = 0\n", "gateway.health.unhealthy_after"),
        (MINIMAL + "\n[gateway.health]\nhealthy_after = 101\n", "gateway.health.healthy_after"),
        (MINIMAL + "\n[gateway.health]\nperiod_s = 1\n", "unknown key `period_s` in `gateway.health`"),
        (MINIMAL + '\n[routing]\npolicy = "coin"\n', "in `routing.policy`"),
        (MINIMAL + "\n[routing.random]\naccuracies = [0.5, 0.6]\n",
         "`routing.random.accuracies` needs one value per tier (1: small), got 2"),
        (MINIMAL + "\n[routing.random]\naccuracies = [1.5]\n", "in `routing.random.accuracies"),
        (MINIMAL + "\n[routing.random]\naccuracies = [nan]\n", "in `routing.random.accuracies"),
        (MINIMAL + "\n[routing.random]\naccuracies = [0.5]\ncosts = [1.0, 2.0]\n",
         "`routing.random.costs` needs one value per tier"),
        (MINIMAL + "\n[routing.random]\naccuracies = [0.5]\ncosts = [-1.0]\n", "in `routing.random.costs"),
        (MINIMAL + "\n[routing.random]\ncosts = [1.0]\n", "`routing.random.costs` needs `routing.random.accuracies`"),
        (MINIMAL + "\n[routing.random]\nseed = -1\n", "in `routing.random.seed`"),
        (MINIMAL + "\n[routing.random]\nseeds = 1\n", "unknown key `seeds` in `routing.random`"),
        (MINIMAL + '\n[routing]\npolicy = "random"\nmode = "cascade"\n',
         "`routing.policy` \"random\" is a null for route mode, and `routing.mode` is \"cascade\""),
    ],
)
def test_bad_config_fails_naming_the_key(toml: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode_config(toml, source="test.toml")
    assert expected in info.value.message
    assert info.value.message.startswith("test.toml: ")


def test_the_random_split_is_configured_under_routing_random() -> None:
    assert decode_config(MINIMAL).routing.random == RandomSplitConfig(seed=0, accuracies=[], costs=[])
    config = decode_config(ladder_toml("http://127.0.0.1:9", '[routing]\npolicy = "random"\n[routing.random]\n'
                                       "seed = 7\naccuracies = [0.3, 0.5, 0.9]\ncosts = [1, 2.5, 9]\n"))
    assert config.routing.policy == "random"
    assert config.routing.random == RandomSplitConfig(seed=7, accuracies=[0.3, 0.5, 0.9], costs=[1.0, 2.5, 9.0])


def test_the_random_policy_needs_no_router_and_reads_none_set() -> None:
    # A `router` left in from the learned config is not read (nor checked), as with the heuristic: one config
    # switches between a learned router and its null by `policy` alone.
    config = decode_config(MINIMAL + '\n[routing]\npolicy = "random"\nrouter = "/no/such/router"\n')
    assert config.routing.policy == "random"


def test_missing_config_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.toml")


def test_a_tier_scorer_is_the_cpu_scorer_none_or_an_sglang_prm() -> None:
    from cascade.branches.cpu_scorer import CPUScorer
    from cascade.branches.prm_client import SGLangPRMScorer
    from cascade.tiers.build import make_scorer

    base = ('[[tiers]]\nname = "t"\nbranches = { n = 4 }\n'
            'backends = [{ kind = "openai", url = "http://127.0.0.1:1", model = "m" }]\n')
    tiers = {
        "cpu": isinstance(make_scorer(decode_config(base).tiers[0]), CPUScorer),
        "none": make_scorer(decode_config(base + 'scorer = "none"\n').tiers[0]) is None,
        "prm": isinstance(make_scorer(decode_config(
            base + 'scorer = { url = "http://127.0.0.1:30001", model = "Qwen/Qwen2.5-Math-PRM-7B" }\n').tiers[0]),
            SGLangPRMScorer),
    }
    assert tiers == {"cpu": True, "none": True, "prm": True}
    with pytest.raises(ConfigError, match="scorer"):
        decode_config(base + 'scorer = "gpu"\n')
    with pytest.raises(ConfigError, match=r"tiers\[0\].branches.alpha` must be in \[0, 1\]"):
        decode_config(base.replace("{ n = 4 }", "{ n = 4, alpha = 1.5 }"))


def test_a_tier_s_branch_settings_are_one_table_under_the_names_a_request_uses() -> None:
    config = decode_config(MINIMAL + "[tiers.branches]\nn = 8\nm = 3\nalpha = 0.5\nbeta = 4\nk = 3\n"
                           "first_wave = 2\nwave_margin = 1\nslots = 16\ntemperature = 0.9\n"
                           'aggregation = "weighted"\nprune_confidence = 0.2\nconfidence_group = 16\n')
    branches = config.tiers[0].branches
    assert (branches.n, branches.m, branches.alpha, branches.beta, branches.k) == (8, 3, 0.5, 4, 3)
    assert (branches.first_wave, branches.wave_margin, branches.slots, branches.temperature) == (2, 1, 16, 0.9)
    assert (branches.aggregation, branches.prune_confidence, branches.confidence_group) == ("weighted", 0.2, 16)
    assert decode_config(MINIMAL).tiers[0].branches.n == 1  # no table: one branch


@pytest.mark.parametrize(("settings", "key"), [
    (BranchSettings(n=0), "n"),
    (BranchSettings(n=2, m=3), "m"),
    (BranchSettings(alpha=1.5), "alpha"),
    (BranchSettings(beta=-1), "beta"),
    (BranchSettings(k=0), "k"),
    (BranchSettings(n=4, m=4, first_wave=1), "first_wave"),
    (BranchSettings(n=4, m=3, first_wave=3), "first_wave"),
    (BranchSettings(n=4, m=4, wave_margin=-1), "wave_margin"),
    (BranchSettings(n=4, m=4, wave_margin=2), "wave_margin"),
    (BranchSettings(prune_confidence=2.0), "prune_confidence"),
    (BranchSettings(confidence_group=0), "confidence_group"),
    (BranchSettings(n=4, m=4, first_wave=2, confidence_keep=1.5), "confidence_keep"),
    (BranchSettings(n=4, m=4, confidence_keep=0.9), "confidence_keep"),
    (BranchSettings(vote_keep=0.0), "vote_keep"),
    (BranchSettings(vote_keep=1.01), "vote_keep"),
    (BranchSettings(confidence_top_k=21), "confidence_top_k"),
    (BranchSettings(confidence_top_k=-1), "confidence_top_k"),
    (BranchSettings(temperature=2.5), "temperature"),
    (BranchSettings(slots=-1), "slots"),
])
def test_every_rule_of_the_branch_settings_is_one_check_naming_the_setting_it_breaks(settings, key) -> None:
    # The config ([tiers.branches]), a request's `branches` override, `cascade bench branches` and the runner all
    # call it; each names the key its own way (tiers[i].branches.<key>, branches.<key>, --<key>).
    with pytest.raises(BrokenRule) as info:
        check_branches(settings)
    assert info.value.key == key
    check_branches(BranchSettings(n=8, m=4, first_wave=2, wave_margin=2, slots=8))  # within every rule


@pytest.mark.parametrize(("tier_keys", "expected"), [
    ("branches = 4\n", "`tiers[1].branches` is a table now: write `n = 4` in [tiers.branches] (or "
                      "`branches = { n = 4 }`)"),
    ("branches_to_finish = 2\n", "`tiers[1].branches_to_finish` moved: write `m` in [tiers.branches]"),
    ("prune_alpha = 0.5\n", "`tiers[1].prune_alpha` moved: write `alpha` in [tiers.branches]"),
    ("prune_beta = 1\n", "`tiers[1].prune_beta` moved: write `beta` in [tiers.branches]"),
    ("score_every_steps = 2\n", "`tiers[1].score_every_steps` moved: write `k` in [tiers.branches]"),
    ("first_wave = 2\n", "`tiers[1].first_wave` moved: write `first_wave` in [tiers.branches]"),
    ("wave_margin = 2\n", "`tiers[1].wave_margin` moved: write `wave_margin` in [tiers.branches]"),
    ("branch_slots = 8\n", "`tiers[1].branch_slots` moved: write `slots` in [tiers.branches]"),
    ("branch_temperature = 0.7\n", "`tiers[1].branch_temperature` moved: write `temperature` in [tiers.branches]"),
    ('aggregation = "weighted"\n', "`tiers[1].aggregation` moved: write `aggregation` in [tiers.branches]"),
    ("prune_confidence = 0.5\n", "`tiers[1].prune_confidence` moved: write `prune_confidence` in [tiers.branches]"),
    ("confidence_group = 8\n", "`tiers[1].confidence_group` moved: write `confidence_group` in [tiers.branches]"),
])
def test_a_branch_key_where_it_used_to_be_fails_naming_its_new_place(tier_keys, expected, tmp_path) -> None:
    toml = MINIMAL + MINIMAL.replace('"small"', '"large"') + tier_keys
    with pytest.raises(ConfigError) as info:
        decode_config(toml, source="test.toml")
    assert info.value.message == f"test.toml: invalid config: {expected}"
    (tmp_path / "cascade.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "cascade.toml")
    assert info.value.message == f"{tmp_path / 'cascade.toml'}: invalid config: {expected}"


@pytest.mark.parametrize(("old", "new"), [("redis_url", "url"), ("redis_timeout_s", "timeout_s"),
                                          ("redis_failure", "failure")])
def test_a_redis_key_of_gateway_fails_naming_its_place_in_gateway_redis(old, new) -> None:
    value = {"redis_url": '"redis://127.0.0.1:6379/0"', "redis_timeout_s": "0.5", "redis_failure": '"closed"'}[old]
    with pytest.raises(ConfigError) as info:
        decode_config(f"[gateway]\n{old} = {value}\n" + MINIMAL)
    assert info.value.message.endswith(f"`gateway.{old}` moved: write `{new}` in [gateway.redis]")


def test_the_shared_limits_redis_is_its_own_table() -> None:
    redis = decode_config('[gateway.redis]\nurl = "redis://127.0.0.1:6379/0"\ntimeout_s = 0.5\nfailure = "closed"\n'
                          + MINIMAL).gateway.redis
    assert (redis.url, redis.timeout_s, redis.failure) == ("redis://127.0.0.1:6379/0", 0.5, "closed")
    assert decode_config(MINIMAL).gateway.redis.url == ""  # no table: limits in each gateway process


WORKER = '[[workers]]\nname = "w"\nmodel = "m"\nport = 9100\n'
# Every family of timeout-like keys, each once: a table's key, written `key = VALUE` in the table's own header.
TIMEOUT_KEYS = [
    ("[gateway]", "keepalive_s"), ("[gateway]", "shutdown_grace_s"), ("[gateway]", "shutdown_linger_s"),
    ("[gateway.limits]", "header_timeout_s"), ("[gateway.limits]", "body_timeout_s"),
    ("[gateway.limits]", "keepalive_timeout_s"), ("[gateway.limits]", "write_timeout_s"),
    ("[gateway.limits]", "max_slot_wait_s"),
    ("[gateway.failover]", "breaker_open_s"), ("[gateway.failover]", "breaker_max_open_s"),
    ("[gateway.health]", "interval_s"), ("[gateway.health]", "timeout_s"), ("[gateway.redis]", "timeout_s"),
    ("[routing.load]", "window_s"), ("[routing.load]", "hold_s"), ("[routing.load]", "ttft_ms"),
    ("[routing.engine_load]", "timeout_s"), ("[routing.engine_load]", "queue_for_s"),
]


def _with(table: str, key: str, value: str) -> str:
    return MINIMAL + f"\n{table}\n{key} = {value}\n"


@pytest.mark.parametrize("value", ["inf", "+inf", "-inf", "nan"])
@pytest.mark.parametrize(("table", "key"), TIMEOUT_KEYS)
def test_a_timeout_that_is_not_a_finite_number_is_refused_naming_its_key(table: str, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode_config(_with(table, key, value), source="test.toml")
    assert f"in `{table.strip('[]')}.{key}`" in info.value.message  # as the key's own bound, or "a finite number"


@pytest.mark.parametrize("value", ["inf", "nan"])
@pytest.mark.parametrize(("toml", "where"), [
    (MINIMAL.replace('model = "m" }', 'model = "m", timeouts = { connect_s = VALUE } }'),
     "tiers[0].backends[0].timeouts.connect_s"),
    (MINIMAL.replace('model = "m" }', 'model = "m", timeouts = { read_s = VALUE } }'),
     "tiers[0].backends[0].timeouts.read_s"),
    (MINIMAL.replace('model = "m" }', 'model = "m", timeouts = { total_s = VALUE } }'),
     "tiers[0].backends[0].timeouts.total_s"),
    (WORKER + "startup_timeout_s = VALUE\n" + MINIMAL, "workers[0].startup_timeout_s"),
])
def test_a_backend_or_worker_timeout_that_is_not_finite_is_refused_naming_its_key(
        toml: str, where: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode_config(toml.replace("VALUE", value), source="test.toml")
    assert f"in `{where}`" in info.value.message
    if value == "inf":
        assert "Expected a finite number (not inf or nan)" in info.value.message


def test_the_largest_finite_timeout_still_loads() -> None:
    assert decode_config(_with("[gateway.limits]", "body_timeout_s", "1e300")).gateway.limits.body_timeout_s == 1e300


def _float_fields(info: msgspec.inspect.Type, path: str) -> Iterator[tuple[str, msgspec.inspect.FloatType]]:
    """Every float of the config's types, by its key's path (lists and dicts as [i], unions each)."""
    match info:
        case msgspec.inspect.FloatType():
            yield path, info
        case msgspec.inspect.StructType():
            for f in info.fields:
                yield from _float_fields(f.type, f"{path}.{f.name}".lstrip("."))
        case msgspec.inspect.UnionType():
            for t in info.types:
                yield from _float_fields(t, path)
        case msgspec.inspect.ListType() | msgspec.inspect.VarTupleType():
            yield from _float_fields(info.item_type, f"{path}[i]")
        case msgspec.inspect.DictType():
            yield from _float_fields(info.value_type, f"{path}[k]")


def test_every_timeout_like_float_of_the_config_is_bounded_finite_and_positive() -> None:
    """A key added later with a bare `float` or an unbounded one fails here: seconds, milliseconds and intervals."""
    timeouts = [(path, t) for path, t in _float_fields(msgspec.inspect.type_info(CascadeConfig), "")
                if path.endswith(("_s", "_ms"))]
    assert len(timeouts) >= 25
    unbounded = [path for path, t in timeouts if t.le is None and t.lt is None]
    negative = [path for path, t in timeouts if t.gt is None and (t.ge is None or t.ge < 0)]
    assert unbounded == [] and negative == []
