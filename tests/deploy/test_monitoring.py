"""The Grafana dashboard and the Prometheus rules (cascade/deploy/monitoring/): the checked-in copies equal the
generator's output; every metric and label they name is one a real gateway exports (its /metrics over real HTTP,
after plain, streamed, branched, failing, falling-back and rate-limited requests; a family registered but not yet
observed counts by its HELP/TYPE lines) or the Envoy model picker's; the rule file has Prometheus' structure, and
with `promtool` installed passes `promtool check rules` and fires each alert, and only it, from synthetic series."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cascade.config import decode_config
from cascade.deploy import monitoring
from cascade.deploy.monitoring import alerts, dashboard
from cascade.deploy.monitoring.promql import PromQLError, label_names, metric_names
from cascade.engines.supervisor import free_port
from cascade.extproc.metrics import ExtprocMetrics
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.processes import CASCADE, run
from tests.gateway.gateway_setup import post_chat, user

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "deploy" / "monitoring"
KEY = "csk-monitoring-test-key-0123456789abcdef"
# Series Prometheus makes itself for every target, and the labels it adds to every series it scrapes.
PROMETHEUS_OWN = {"up"}
TARGET_LABELS = {"instance", "job"}
# Labels of families the test does not drive (load-reactive degradation needs a tier pressed by its SLO), each
# checked against the family's definition in cascade/service/metrics.py by name.
UNOBSERVED_LABELS = {"requested", "served", "branches_cut"}

CONFIG = """
[routing.load]
enabled = true
ttft_ms = 5000
e2el_ms = 20000

[routing.engine_load]
poll_s = 0.05

[gateway.redis]
url = "redis://127.0.0.1:{dead_port}/0"
failure = "open"
timeout_s = 0.05

[[gateway.keys]]
name = "team-a"
sha256 = "{digest}"
requests_per_minute = 12

[[tiers]]
name = "small"
default_max_tokens = 32
backends = [{{ kind = "openai", url = "{plain}", model = "fake-small" }}]

[[tiers]]
name = "medium"
default_max_tokens = 32
backends = [{{ kind = "sglang", url = "{sglang}", model = "fake-medium" }}]

[[tiers]]
name = "thinker"
default_max_tokens = 32
branches = {{ n = 3, m = 2 }}
backends = [{{ kind = "openai", url = "{plain}", model = "fake-thinker" }}]
"""


def test_the_checked_in_dashboard_and_rules_are_the_generators_output() -> None:
    for name, text in monitoring.files().items():
        assert (CHECKED_IN / name).read_text() == text, \
            f"deploy/monitoring/{name} is stale: run `python -m cascade.deploy.monitoring deploy/monitoring`"


def test_the_dashboard_is_grafanas_json_model_with_one_query_per_target() -> None:
    model = json.loads(monitoring.files()[monitoring.DASHBOARD_FILE])
    panels = [p for p in model["panels"] if p["type"] == "timeseries"]
    assert len(panels) == sum(len(row.panels) for row in dashboard.ROWS)
    assert len({p["id"] for p in model["panels"]}) == len(model["panels"])
    assert all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in panels)
    cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in model["panels"]]
    assert len(set(cells)) == len(cells)  # no two panels in one place


def test_deploy_gateways_writes_them_beside_envoy_and_the_manifests(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"tiers": ["a"], "operating_points": [], "gpus_per_node": 8, "deployment": [
        {"tier": "a", "gpus": 1, "replicas": 1, "tp": 1, "model": "org/a"}]}))
    wrote = run([*CASCADE, "deploy", "--plan", str(plan), "--gateways", "2", "--out", str(tmp_path / "s")], 60)
    assert wrote.returncode == 0, wrote.stderr.decode()
    for name, text in monitoring.files().items():
        assert (tmp_path / "s" / "monitoring" / name).read_text() == text
    assert monitoring.main([]) == 2  # `python -m cascade.deploy.monitoring` without OUT_DIR: its usage


@contextmanager
def gateway_with_every_series() -> Iterator[str]:
    """A gateway over real HTTP with tiers on a plain fake, a fake SGLang (engine load) and a branched tier,
    load-reactive routing, an API key with a request limit and a Redis that is not there (fail open)."""
    with ExitStack() as stack:
        plain = stack.enter_context(serve_asgi(FakeEngine(FakeScript(tokens=8))))
        sglang = stack.enter_context(serve_asgi(FakeSGLang(FakeScript(tokens=8))))
        config = CONFIG.format(dead_port=free_port(), digest=hashlib.sha256(KEY.encode()).hexdigest(),
                               plain=plain, sglang=sglang)
        gateway = Gateway(decode_config(config))
        yield stack.enter_context(serve_asgi(gateway.app, lifespan="on"))


def exported(text: str) -> tuple[set[str], set[str]]:
    """The series names and label names a /metrics text exports, unobserved families included."""
    names, labels = set(), set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "summary": ("_sum", "_count", "")}.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
        for sample in family.samples:
            names.add(sample.name)
            labels |= set(sample.labels)
    return names, labels


def scrape_after_traffic() -> str:
    pytest.importorskip("redis", reason="the `redis` extra: the gateway's Redis series exist with a Redis URL")
    bearer = {"authorization": f"Bearer {KEY}"}
    with gateway_with_every_series() as base:
        statuses = [
            post_chat(base, {"model": "cascade", "messages": user("What is 2 + 2?")}, bearer).status_code,
            post_chat(base, {"model": "medium", "messages": user("hi"), "stream": True}, bearer).status_code,
            post_chat(base, {"model": "thinker", "messages": user("think")}, bearer).status_code,
        ]
        # A routed request whose tier fails falls back to another (route mode): the prompt that fails on the tier
        # the router picks for it; a named tier that fails is a 502.
        failing = [f"[fake@fake-{tier} status=500] Count to three" for tier in ("small", "medium", "thinker")]
        routed = [httpx.post(f"{base}/v1/route", json={"model": "cascade", "messages": user(prompt)},
                             headers=bearer, timeout=10).json()["tier_name"] for prompt in failing]
        prompt = next(p for p, tier in zip(failing, routed, strict=True) if f"fake-{tier} " in p)
        statuses.append(post_chat(base, {"model": "cascade", "messages": user(prompt)}, bearer).status_code)
        statuses.append(post_chat(base, {"model": "small", "messages": user("[fake status=500] x")},
                                  bearer).status_code)
        statuses += [post_chat(base, {"model": "small", "messages": user("hi")}, bearer).status_code
                     for _ in range(8)]
        assert statuses[:4] == [200, 200, 200, 200] and statuses[4] == 502 and 429 in statuses[5:], statuses
        return httpx.get(f"{base}/metrics", timeout=10).text


def picker_text() -> str:
    picker = ExtprocMetrics(["small"])
    picker.decided("small", key="team-a")
    picker.decided("small", via_gateway=True)
    picker.refused(429)
    picker.observe(0.001)
    return generate_latest(picker.registry).decode()


def unknown_in(exprs: list[str], names: set[str], labels: set[str]) -> list[str]:
    """What the expressions name that is not exported, one line each."""
    found = []
    for expr in exprs:
        found += [f"metric {m!r} in {expr}" for m in sorted(metric_names(expr) - names - PROMETHEUS_OWN)]
        found += [f"label {lb!r} in {expr}" for lb in sorted(label_names(expr) - labels - TARGET_LABELS - {"le"})]
    return found


def test_every_metric_and_label_the_dashboard_and_the_rules_name_is_exported() -> None:
    gateway_names, gateway_labels = exported(scrape_after_traffic())
    picker_names, picker_labels = exported(picker_text())
    names, labels = gateway_names | picker_names, gateway_labels | picker_labels | UNOBSERVED_LABELS
    assert "cascade_tier_fallbacks_total" in gateway_names and {"from_tier", "to_tier"} <= gateway_labels
    assert {"cascade_engine_queue_requests", "cascade_redis_up", "cascade_tier_pressure"} <= gateway_names
    assert unknown_in(monitoring.expressions(), names, labels) == []
    metrics_py = (REPO / "cascade" / "service" / "metrics.py").read_text()
    assert all(f'"{label}"' in metrics_py for label in UNOBSERVED_LABELS)


def test_a_panel_naming_a_metric_or_label_that_is_not_exported_is_caught() -> None:
    names, labels = {"cascade_requests_total"}, {"tier", "outcome"}
    assert unknown_in(['sum by (tier) (rate(cascade_requests_total{outcome="ok"}[5m]))'], names, labels) == []
    assert unknown_in(["sum by (tier) (rate(cascade_request_total[5m]))"], names, labels) == \
        ["metric 'cascade_request_total' in sum by (tier) (rate(cascade_request_total[5m]))"]
    assert len(unknown_in(["sum by (teir) (rate(cascade_requests_total[5m]))"], names, labels)) == 1
    with pytest.raises(PromQLError, match="rat"):
        metric_names("sum(rat(cascade_requests_total[5m]))")


@pytest.mark.parametrize(("expr", "metrics", "labels"), [
    ('sum by (tier, le) (rate(a_bucket{outcome!="ok"}[$__rate_interval]))', {"a_bucket"}, {"tier", "le", "outcome"}),
    ("x / on (instance, tier) group_left (replica) y offset 5m", {"x", "y"}, {"instance", "tier", "replica"}),
    ('up{job="cascade"} == bool 0 or info_total', {"up", "info_total"}, {"job"}),
    ("histogram_quantile(0.99, sum(rate(b_bucket[5m])) by (le)) > 2e-3", {"b_bucket"}, {"le"}),
    ("min_over_time(s[5m:30s]) >= 1 unless count(s) by (tier)", {"s"}, {"tier"}),
])
def test_the_scanner_tells_metric_names_from_functions_keywords_labels_and_durations(
        expr: str, metrics: set[str], labels: set[str]) -> None:
    assert metric_names(expr) == metrics and label_names(expr) == labels


def test_the_rule_file_has_prometheus_structure_and_reads_back_as_written() -> None:
    yaml = pytest.importorskip("yaml")
    text = monitoring.files()[monitoring.RULES_FILE]
    assert yaml.safe_load(text) == alerts.rule_groups()
    (group,) = alerts.rule_groups()["groups"]
    names = [rule["alert"] for rule in group["rules"]]
    assert len(set(names)) == len(names)
    for rule in group["rules"]:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert set(rule["annotations"]) == {"summary", "description"}
        assert rule["for"][:-1].isdigit() and rule["for"][-1] in "smh"


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus package) is not installed")


@needs_promtool
def test_promtool_accepts_the_rule_file(tmp_path: Path) -> None:
    monitoring.write(tmp_path)
    checked = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / monitoring.RULES_FILE)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts.RULES)} rules found" in checked.stdout


@needs_promtool
def test_each_alert_fires_on_its_fault_and_none_on_a_healthy_deployment(tmp_path: Path) -> None:
    from tests.deploy.alert_scenarios import rule_tests

    rules = alerts.rule_groups()
    for rule in rules["groups"][0]["rules"]:
        del rule["annotations"]  # promtool compares annotations too; their wording is not what this tests
    (tmp_path / "rules.yml").write_text(json.dumps(rules))
    (tmp_path / "tests.yml").write_text(json.dumps(rule_tests("rules.yml")))
    ran = subprocess.run([str(PROMTOOL), "test", "rules", str(tmp_path / "tests.yml")], capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
