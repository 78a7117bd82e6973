"""OpenTelemetry traces (cascade/tracing/): the span tree of a request, the W3C traceparent in and out, no text unless
asked, hostile trace headers ignored. Real gateways over HTTP on 127.0.0.1 in front of the fake engine, their spans
read from the SDK's in-memory exporter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from cascade import tracing
from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.sglang import FakeSGLang
from cascade.testing.servers import TIERS
from cascade.testing.waiting import eventually
from cascade.tracing.otel import OTelTracer
from tests.gateway.gateway_setup import post_chat, running_gateway, small_and_thinker_toml, user
from tests.gateway.test_failover import broken_replay, ladder
from tests.servers import Reply

TRACE_ID, PARENT_ID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
WELL_FORMED = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


class Recording:
    """The fake engine, recording the headers of every chat request it gets."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine, self.headers = engine, []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.engine(scope, receive, send)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracer = OTelTracer.to(exporter)
    tracing.install(tracer)
    try:
        yield exporter
    finally:
        tracing.install(None)
        tracer.shutdown()


def traced(exporter: InMemorySpanExporter, servers: int = 1) -> list[ReadableSpan]:
    """The finished spans once `servers` server spans ended (a response is sent before its span ends)."""
    assert eventually(lambda: sum(s.kind == SpanKind.SERVER for s in exporter.get_finished_spans()) >= servers, 5)
    return list(exporter.get_finished_spans())


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def children(spans: list[ReadableSpan], parent: ReadableSpan, kind: SpanKind | None = None) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
            and (kind is None or s.kind == kind)]


def traceparent(span: ReadableSpan) -> str:
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


@contextmanager
def recorded_gateway(toml_of: Any, engine_app: Any = None) -> Iterator[tuple[str, Recording]]:
    """A gateway on `toml_of(engine_url)` in front of a recording fake engine (FakeEngine unless given)."""
    engine = Recording(engine_app or FakeEngine(FakeScript(tokens=8)))
    with ExitStack() as stack:
        url = stack.enter_context(serve_asgi(engine))
        yield stack.enter_context(serve_asgi(Gateway(decode_config(toml_of(url))).app, lifespan="on")), engine


def test_a_plain_request_is_one_trace_of_a_server_a_route_and_a_genai_client_span(spans) -> None:
    with running_gateway() as (base, engine_url, _):
        response = post_chat(base, {"model": "cascade", "messages": user("hello")})
    assert response.status_code == 200
    trace = traced(spans)
    server = one(trace, "POST /v1/chat/completions")
    assert server.kind == SpanKind.SERVER and server.parent is None and len({s.context.trace_id for s in trace}) == 1
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["cascade.tier"] == response.headers["x-cascade-tier"]
    assert response.headers["traceparent"] == traceparent(server)
    route = one(trace, "cascade.route")
    assert route.parent.span_id == server.context.span_id and route.kind == SpanKind.INTERNAL
    assert route.attributes["cascade.tier"] == response.headers["x-cascade-tier"]
    assert route.attributes["cascade.routing.policy"] == "heuristic" and route.attributes["cascade.quality"] == "balanced"
    assert route.attributes["cascade.out_of_domain"] is False and "cascade.load.in_flight" in route.attributes
    [call] = children(trace, server, SpanKind.CLIENT)
    model = f"fake-{TIERS.index(response.headers['x-cascade-tier'])}"
    usage = response.json()["usage"]
    assert call.name == f"chat {model}"
    assert {k: call.attributes[k] for k in ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                                            "server.address", "server.port")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": model,
        "server.address": "127.0.0.1", "server.port": int(engine_url.rsplit(":", 1)[1])}
    assert call.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert call.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert call.attributes["gen_ai.response.finish_reasons"] == ("stop",) and "error.type" not in call.attributes


def test_the_route_span_names_the_random_policy_that_decided(spans) -> None:
    extra = '[routing]\npolicy = "random"\n[routing.random]\nseed = 3\n'
    with running_gateway(extra=extra) as (base, _, _):
        response = post_chat(base, {"model": "cascade", "messages": user("hello")})
    assert response.status_code == 200 and response.json()["cascade"]["router"] == "random"
    route = one(traced(spans), "cascade.route")
    assert route.attributes["cascade.routing.policy"] == "random"
    assert route.attributes["cascade.route_score"] == route.attributes["cascade.difficulty"]
    assert route.attributes["cascade.tier"] == response.headers["x-cascade-tier"]


def test_a_route_request_is_a_server_span_and_its_decision_with_no_upstream_call(spans) -> None:
    with running_gateway() as (base, _, _):
        response = httpx.post(f"{base}/v1/route", json={"model": "cascade:best", "messages": user()}, timeout=10)
    trace = traced(spans)
    server = one(trace, "POST /v1/route")
    assert response.headers["traceparent"] == traceparent(server)
    [route] = children(trace, server)
    assert route.name == "cascade.route" and route.attributes["cascade.tier"] == response.json()["tier_name"]
    assert route.attributes["cascade.quality"] == "best" and not [s for s in trace if s.kind == SpanKind.CLIENT]


def test_an_escalated_cascade_request_has_a_client_span_per_tier_it_asked(spans) -> None:
    with running_gateway(extra='[routing]\nmode = "cascade"\n') as (base, _, _):
        response = post_chat(base, {"model": "cascade:balanced", "messages": user("[fake@fake-0 tokens=100] 2 + 2?")})
    assert response.json()["cascade"]["escalations"] == 1
    trace = traced(spans)
    server = one(trace, "POST /v1/chat/completions")
    calls = sorted(children(trace, server, SpanKind.CLIENT), key=lambda s: s.start_time)
    assert [c.name for c in calls] == ["chat fake-0", "chat fake-1"]
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in calls] == [("length",), ("stop",)]
    assert server.attributes["cascade.tier"] == TIERS[1]


def test_a_failover_retry_is_a_second_client_span_after_the_failed_one(spans) -> None:
    engine = FakeEngine(FakeScript(tokens=4))
    with ExitStack() as stack:
        bad = stack.enter_context(serve_asgi(broken_replay(Reply(status=500, body=b'{"error":{"message":"x"}}'))))
        good = stack.enter_context(serve_asgi(engine))
        base = stack.enter_context(serve_asgi(Gateway(decode_config(ladder({"only": [bad, good]}))).app,
                                              lifespan="on"))
        answers = [post_chat(base, {"model": "only", "messages": user()}) for _ in range(4)]
    assert any(a.json()["cascade"]["retries"] == 1 for a in answers)
    trace = traced(spans, servers=4)
    retried = [server for server in trace if server.kind == SpanKind.SERVER
               and len(children(trace, server, SpanKind.CLIENT)) == 2]
    assert retried
    failed, answered = sorted(children(trace, retried[0], SpanKind.CLIENT), key=lambda s: s.start_time)
    assert failed.attributes["error.type"] and failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["server.port"] == int(bad.rsplit(":", 1)[1])
    assert "error.type" not in answered.attributes and answered.attributes["server.port"] == int(good.rsplit(":", 1)[1])


def test_a_branched_request_has_a_span_per_branch_with_prune_stop_and_vote_events(spans) -> None:
    def toml(url: str) -> str:
        return small_and_thinker_toml(url).replace(
            "branches = { n = 3, m = 2 }",
            'branches = { n = 3, m = 1, prune_confidence = 0.5, confidence_group = 4 }\nscorer = "none"')

    prompt = ("[fake answer=So_the_answer_is_18.|####_18 itl_ms=10] [fake@seed=1 logprob=-3 itl_ms=5] "
              "[fake@seed=2 itl_ms=40 tokens=300] Q")
    with recorded_gateway(toml) as (base, engine):
        body = post_chat(base, {"model": "thinker", "seed": 0, "messages": user(prompt)}).json()
    report = body["cascade"]["branches"]
    assert (report["finished"], report["pruned"], report["early_stopped"]) == (1, 1, 1), report
    trace = traced(spans)
    run = one(trace, "cascade.branches")
    assert run.parent.span_id == one(trace, "POST /v1/chat/completions").context.span_id
    assert (run.attributes["cascade.tier"], run.attributes["cascade.branches.n"]) == ("thinker", 3)
    [(vote, voted)] = [(e.name, e.attributes) for e in run.events]
    assert vote == "vote" and voted["cascade.branch.chosen"] == 0 and voted["cascade.branches.finished"] == 1
    branches = {s.attributes["cascade.branch.index"]: s for s in children(trace, run)}
    assert {i: b.attributes["cascade.branch.outcome"] for i, b in branches.items()} == {
        0: "finished", 1: "pruned", 2: "stopped"}
    assert [e.name for e in branches[0].events] == [] and [e.name for e in branches[1].events] == ["prune"]
    assert [e.name for e in branches[2].events] == ["stop"]
    for branch in branches.values():  # each branch's upstream call is in its branch's span, and the engine knew it
        [call] = children(trace, branch, SpanKind.CLIENT)
        assert call.name == "chat fake-big"
        assert any(h.get("traceparent") == traceparent(call) for h in engine.headers)


def test_an_incoming_traceparent_is_the_parent_and_reaches_the_engine_with_its_tracestate(spans) -> None:
    state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    with recorded_gateway(small_and_thinker_toml) as (base, engine):
        response = post_chat(base, {"model": "small", "messages": user()},
                             headers={"traceparent": TRACEPARENT, "tracestate": state})
    trace = traced(spans)
    server = one(trace, "POST /v1/chat/completions")
    assert f"{server.context.trace_id:032x}" == TRACE_ID and f"{server.parent.span_id:016x}" == PARENT_ID
    assert response.headers["traceparent"] == traceparent(server)
    [call] = children(trace, server, SpanKind.CLIENT)
    [sent] = engine.headers
    assert sent["traceparent"] == traceparent(call) and sent["tracestate"] == state


def test_an_sglang_tier_s_calls_name_sglang_and_carry_the_traceparent_beside_the_rid(spans) -> None:
    def toml(url: str) -> str:
        return f'[[tiers]]\nname = "gpu"\nbackends = [{{ kind = "sglang", url = "{url}", model = "fake-1" }}]\n'

    with recorded_gateway(toml, FakeSGLang(FakeScript(tokens=4))) as (base, engine):
        response = post_chat(base, {"model": "gpu", "messages": user()})
    assert response.status_code == 200
    [call] = [s for s in traced(spans) if s.kind == SpanKind.CLIENT]
    assert call.attributes["gen_ai.provider.name"] == "sglang" and call.attributes["gen_ai.usage.output_tokens"] == 4
    assert engine.headers[0]["traceparent"] == traceparent(call)


def test_an_unsampled_caller_is_followed_records_nothing_and_still_propagates(spans) -> None:
    with recorded_gateway(small_and_thinker_toml) as (base, engine):
        response = post_chat(base, {"model": "small", "messages": user()},
                             headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"})
    assert response.status_code == 200 and spans.get_finished_spans() == ()
    assert response.headers["traceparent"].startswith(f"00-{TRACE_ID}-") and response.headers["traceparent"][-2:] == "00"
    assert engine.headers[0]["traceparent"].startswith(f"00-{TRACE_ID}-")


@pytest.mark.parametrize("ratio", [0.0, 0.25, 1.0])
def test_a_new_trace_is_sampled_as_the_sdks_ratio_sampler_decides_and_its_children_follow(ratio: float) -> None:
    """cascade's spans (RecordingSpan) decide a root's sampling by the SDK's TraceIdRatioBased rule on its trace id;
    an unsampled span records nothing yet has ids to pass on; children inherit the decision."""
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    exporter = InMemorySpanExporter()
    tracer = OTelTracer.to(exporter, ratio=ratio)
    sdk = TraceIdRatioBased(ratio)
    sampled = []
    for _ in range(400):
        root = tracer.start("root")
        child = tracer.start("child", parent=root)
        carrier: dict[str, str] = {}
        child.inject(carrier)
        assert WELL_FORMED.fullmatch(carrier["traceparent"]) and carrier["traceparent"][3:35] == f"{root.trace_id:032x}"
        expected = sdk.should_sample(None, root.trace_id, "root").decision.is_sampled()
        assert root.is_recording() == child.is_recording() == expected
        assert carrier["traceparent"].endswith("-01" if expected else "-00")
        child.end()
        root.end()
        sampled.append(expected)
    finished = exporter.get_finished_spans()
    assert len(finished) == 2 * sum(sampled)
    assert all(s.parent.span_id == r.context.span_id for s, r in zip(finished[::2], finished[1::2], strict=True))
    if ratio in (0.0, 1.0):
        assert set(sampled) == {bool(ratio)}
    else:
        assert 0.15 < sum(sampled) / len(sampled) < 0.35


def test_a_span_ends_once_and_records_nothing_after() -> None:
    exporter = InMemorySpanExporter()
    tracer = OTelTracer.to(exporter)
    span = tracer.start("once", attributes={"a": [1, 2]})
    span.end()
    span.set_attribute("b", 1)
    span.add_event("late")
    span.end()
    [finished] = exporter.get_finished_spans()
    assert dict(finished.attributes) == {"a": (1, 2)} and finished.events == ()
    assert finished.end_time >= finished.start_time and finished.resource.attributes["service.name"] == "cascade"


@pytest.mark.parametrize(("ratio", "flag", "recorded"), [(0.0, "01", False), (1.0, "00", True)])
def test_without_following_the_caller_the_gateways_ratio_decides_and_the_trace_is_still_joined(
        ratio: float, flag: str, recorded: bool) -> None:
    """`follow_caller_sampling = false`: a client's sampled flag cannot force its requests to be traced (nor stop
    them being traced); its trace id and parent are still the spans'."""
    exporter = InMemorySpanExporter()
    tracing.install(OTelTracer.to(exporter, ratio=ratio, follow_caller=False))
    try:
        with recorded_gateway(small_and_thinker_toml) as (base, engine):
            response = post_chat(base, {"model": "small", "messages": user()},
                                 headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-{flag}"})
    finally:
        tracing.install(None)
    assert response.status_code == 200
    assert response.headers["traceparent"].startswith(f"00-{TRACE_ID}-")
    assert response.headers["traceparent"].endswith("-01" if recorded else "-00")
    assert engine.headers[0]["traceparent"].startswith(f"00-{TRACE_ID}-")
    if recorded:
        server = one(traced(exporter), "POST /v1/chat/completions")
        assert server.parent.span_id == int(PARENT_ID, 16) and server.context.trace_id == int(TRACE_ID, 16)
    else:
        assert exporter.get_finished_spans() == ()


def test_without_following_the_caller_a_caller_cannot_force_tracing_by_choosing_its_trace_ids() -> None:
    """The ratio rule reads the trace id's low 64 bits; a caller that picks them small was traced every time (40 of
    40 at a ratio of 0.01). Not following the caller, the gateway draws for itself."""
    tracer = OTelTracer.to(InMemorySpanExporter(), ratio=0.01, follow_caller=False)
    chosen = [SpanContext(trace_id=(i + 1) << 64, span_id=int(PARENT_ID, 16), is_remote=True,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED)) for i in range(400)]
    sampled = sum(tracer.start("POST /v1/chat/completions", parent=context).flags.sampled for context in chosen)
    assert sampled <= 20  # 4 expected at 0.01; every one of them was traced before


def test_with_tracing_off_no_trace_header_is_added_either_way() -> None:
    with recorded_gateway(small_and_thinker_toml) as (base, engine):
        response = post_chat(base, {"model": "small", "messages": user()}, headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200 and "traceparent" not in response.headers
    assert "traceparent" not in engine.headers[0]


def test_spans_carry_no_prompt_or_answer_text_unless_capture_text_is_set(spans) -> None:
    prompt = "[fake answer=the_hidden_answer] my hidden question"

    def texts(trace: list[ReadableSpan]) -> str:
        return repr([(dict(s.attributes), [dict(e.attributes) for e in s.events]) for s in trace])

    with running_gateway() as (base, _, _):
        post_chat(base, {"model": "cascade", "messages": user(prompt)})
        assert "hidden" not in texts(traced(spans))
        spans.clear()
        tracing.active.capture_text = True
        post_chat(base, {"model": "cascade", "messages": user(prompt)})
        [call] = [s for s in traced(spans) if s.kind == SpanKind.CLIENT]
    assert "my hidden question" in call.attributes["gen_ai.input.messages"]
    assert "the hidden answer" in call.attributes["gen_ai.output.messages"]


HOSTILE = [
    ["garbage"], [""], [TRACEPARENT.upper()], [f"ff-{TRACE_ID}-{PARENT_ID}-01"], [f"00-{'0' * 32}-{PARENT_ID}-01"],
    [f"00-{TRACE_ID}-{'0' * 16}-01"], [TRACEPARENT + "-extra"], [TRACEPARENT, TRACEPARENT], [TRACEPARENT + "-" + "0" * 300],
    ["00-" + "a" * 8000],
]


@pytest.fixture(scope="module")
def hostile_gateway() -> Iterator[tuple[str, Recording, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracer = OTelTracer.to(exporter)
    tracing.install(tracer)
    try:
        with recorded_gateway(small_and_thinker_toml) as (base, engine):
            yield base, engine, exporter
    finally:
        tracing.install(None)
        tracer.shutdown()


@pytest.mark.parametrize("values", HOSTILE, ids=range(len(HOSTILE)))
def test_a_malformed_or_repeated_traceparent_starts_a_new_trace(hostile_gateway, values: list[str]) -> None:
    base, engine, _ = hostile_gateway
    response = post_chat(base, {"model": "small", "messages": user()}, headers=[("traceparent", v) for v in values])
    assert response.status_code == 200 and WELL_FORMED.fullmatch(response.headers["traceparent"])
    assert TRACE_ID not in response.headers["traceparent"] and TRACE_ID not in engine.headers[-1]["traceparent"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(traceparent=st.one_of(
           st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300),
           st.builds(lambda v, t, s, f, tail, n: f"{v}-{t}-{s}-{f}{tail}" * n,
                     st.sampled_from(["00", "01", "fe", "ff", "0", "000"]), st.text("0123456789abcdefAF", max_size=40),
                     st.text("0123456789abcdef", max_size=20), st.sampled_from(["00", "01", "ff", "1"]),
                     st.sampled_from(["", "-", "-x", " ", "\t"]), st.integers(1, 100))),
       tracestate=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=2000))
def test_hostile_trace_headers_never_fail_a_request(hostile_gateway, traceparent: str, tracestate: str) -> None:
    base, engine, _ = hostile_gateway
    headers = {"traceparent": traceparent.strip(), "tracestate": tracestate.strip()}
    response = post_chat(base, {"model": "small", "messages": user()}, headers=headers)
    assert response.status_code == 200 and WELL_FORMED.fullmatch(response.headers["traceparent"])
    sent = engine.headers[-1]
    assert WELL_FORMED.fullmatch(sent["traceparent"]) and len(sent.get("tracestate", "")) <= 512
