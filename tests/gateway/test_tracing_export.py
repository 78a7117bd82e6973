"""Traces leave the process: `cascade serve` exports them over OTLP/HTTP to a real receiver on 127.0.0.1, and a
gateway without the `otel` extra serves as before and refuses a tracing config with one clear line."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")

from cascade.engines.supervisor import free_port
from cascade.testing.otlp import otlp_receiver
from cascade.testing.servers import TIERS, cascade_serve, fake_engine
from cascade.testing.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_cascade_serve_exports_one_trace_per_request_to_an_otlp_http_receiver(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the batch processor's export interval (ms), inherited
    with otlp_receiver() as (endpoint, receiver), fake_engine(tmp_path, "--tokens", "6") as engine_url:
        toml = f'[gateway.tracing]\nendpoint = "{endpoint}"\nservice_name = "cascade-test"\n'
        with cascade_serve(tmp_path, engine_url, toml) as served:
            response = httpx.post(f"{served.url}/v1/chat/completions", timeout=30,
                                  headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
                                  json={"model": TIERS[0], "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 200 and response.headers["traceparent"].startswith(f"00-{TRACE_ID}-")
            assert eventually(lambda: any(s.kind == "SERVER" for s in receiver.spans), 15), served.output()
    spans = {s.name: s for s in receiver.spans}
    assert {s.trace_id for s in receiver.spans} == {TRACE_ID} and {s.service for s in receiver.spans} == {"cascade-test"}
    server, route, call = spans["POST /v1/chat/completions"], spans["cascade.route"], spans["chat fake-0"]
    assert server.parent_span_id == "00f067aa0ba902b7" and response.headers["traceparent"][36:52] == server.span_id
    assert route.parent_span_id == server.span_id and route.attributes["cascade.tier"] == TIERS[0]
    assert call.kind == "CLIENT" and call.parent_span_id == server.span_id
    assert call.attributes["gen_ai.operation.name"] == "chat" and call.attributes["gen_ai.usage.output_tokens"] == 6
    assert call.attributes["gen_ai.response.finish_reasons"] == ["stop"]


def test_without_the_otel_extra_the_gateway_serves_and_a_tracing_config_is_one_clear_error() -> None:
    program = """
import sys
class Block:  # as if no OpenTelemetry package were installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from cascade.config import decode_config
from cascade.errors import ConfigError
from cascade.gateway.server import Gateway
from cascade.testing.servers import ladder_toml
from tests.gateway.gateway_setup import post_chat, running_gateway, user
with running_gateway() as (base, _, _):
    response = post_chat(base, {"model": "cascade", "messages": user()})
    assert response.status_code == 200 and "traceparent" not in response.headers, response.text
assert not [m for m in sys.modules if m.startswith("opentelemetry")]
try:
    Gateway(decode_config(ladder_toml("http://127.0.0.1:9", '[gateway.tracing]\\nendpoint = "http://127.0.0.1:9/v1/traces"\\n')))
except ConfigError as exc:
    print(exc.message)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout.strip()
    assert message.startswith("`gateway.tracing.endpoint` is set but OpenTelemetry is not installed")
    assert "`otel` extra" in message


class HungCollector:
    """A TCP port that accepts connections and never answers: a collector that hangs (or a firewall that drops)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.listener.accept()[0])

    def close(self) -> None:
        for conn in [*self.held, self.listener]:
            conn.close()


@pytest.mark.parametrize("collector", ["refused", "hung"])
def test_a_collector_that_is_down_or_hung_costs_spans_never_requests_or_a_stuck_shutdown(
        tmp_path, monkeypatch, collector: str) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export every 50 ms: every export meets the fault
    hung = HungCollector() if collector == "hung" else None
    port = hung.port if hung is not None else free_port()  # nothing listens on a free port: refused
    try:
        with fake_engine(tmp_path, "--tokens", "4") as engine_url:
            toml = f'[gateway.tracing]\nendpoint = "http://127.0.0.1:{port}/v1/traces"\n'
            with cascade_serve(tmp_path, engine_url, toml) as served:
                codes = [httpx.post(f"{served.url}/v1/chat/completions", timeout=30, json={
                    "model": TIERS[0], "messages": [{"role": "user", "content": f"hi {i}"}]}).status_code
                    for i in range(40)]
                assert codes == [200] * 40, served.output()
                served.stop()
                # The last flush waits up to the exporter's timeout (10 s) per batch still queued (here one).
                assert served.wait_exit(within_s=40) < 40, served.output()
    finally:
        if hung is not None:
            hung.close()
