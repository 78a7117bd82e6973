"""The fake engine's fault modes, as a client sees them over real HTTP (and the soak that uses them)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from cascade.cli import build_parser
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.fakes.garbage import GARBAGE, start_garbage_server
from cascade.testing.fakes.script import FAULTS
from cascade.testing.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
FULL = "t0 t1 t2 t3 t4 t5 "  # the answer of a 6-token script


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(FakeScript(tokens=6))


@pytest.fixture
def url(engine: FakeEngine) -> Iterator[str]:
    with serve_asgi(engine) as base:
        yield base


def chat(fault: str = "", stream: bool = False, text: str = "hello") -> dict:
    content = f"{text} [fake fault={fault}]" if fault else text
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": content}]}


def post(base: str, body: dict, read_s: float = 5.0) -> httpx.Response:
    """POST and read the whole body (raw: no decoding) within a read timeout of `read_s`."""
    with httpx.Client(timeout=httpx.Timeout(5.0, read=read_s)) as client:
        return client.post(f"{base}/v1/chat/completions", json=body)


def stream_until_error(base: str, body: dict, read_s: float = 5.0) -> tuple[int, bytes, httpx.HTTPError | None]:
    """Stream a response: (status, the bytes received, the error that ended the body early or None)."""
    received = b""
    with httpx.Client(timeout=httpx.Timeout(5.0, read=read_s)) as client, \
            client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        try:
            for chunk in response.iter_raw():
                received += chunk
        except httpx.HTTPError as exc:
            return response.status_code, received, exc
    return response.status_code, received, None


def sse_data(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


def stream_content(events: list[str]) -> tuple[str, list[str | None]]:
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return content, [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]


def test_no_fault_streams_every_token_then_stop_and_done(url: str) -> None:
    response = post(url, chat(stream=True))
    events = sse_data(response.text)
    assert response.status_code == 200 and events[-1] == "[DONE]"
    assert stream_content(events) == (FULL, [None] * 6 + ["stop"])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "completion"])
def test_html_fault_answers_200_with_an_html_page(url: str, stream: bool) -> None:
    response = post(url, chat("html", stream))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.text.startswith("<html>") and "Bad Gateway" in response.text


def test_malformed_sse_fault_streams_events_that_are_not_json(url: str) -> None:
    response = post(url, chat("malformed_sse", stream=True))
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
    assert sse_data(response.text) == ["{oops", "{oops", "[DONE]"]


def test_malformed_sse_fault_answers_a_completion_body_that_is_not_json(url: str) -> None:
    response = post(url, chat("malformed_sse"))
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_truncated_stream_ends_cleanly_without_a_finish_reason_or_done(url: str) -> None:
    response = post(url, chat("truncated", stream=True))  # no exception: the chunked body ended properly
    events = sse_data(response.text)
    assert response.status_code == 200 and "[DONE]" not in events
    assert stream_content(events) == ("t0 t1 t2 ", [None, None, None])


def test_truncated_completion_is_cut_short_with_a_null_finish_reason(url: str) -> None:
    response = post(url, chat("truncated"))
    choice = response.json()["choices"][0]
    assert response.status_code == 200
    assert (choice["finish_reason"], choice["message"]["content"]) == (None, "t0 t1 t2 ")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "completion"])
def test_stall_first_byte_sends_no_headers_until_the_client_gives_up(
    url: str, engine: FakeEngine, stream: bool
) -> None:
    with httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as client, pytest.raises(httpx.ReadTimeout):
        client.send(client.build_request("POST", f"{url}/v1/chat/completions", json=chat("stall_first_byte", stream)),
                    stream=True)  # returns once headers arrive: they never do
    assert eventually(lambda: engine.stats.in_flight == 0)  # the stall ends when the client leaves


def test_stall_mid_stream_sends_some_tokens_then_nothing(url: str, engine: FakeEngine) -> None:
    status, received, error = stream_until_error(url, chat("stall_mid", stream=True), read_s=0.3)
    assert status == 200 and isinstance(error, httpx.ReadTimeout)
    assert stream_content(sse_data(received.decode())) == ("t0 t1 t2 ", [None, None, None])
    assert eventually(lambda: engine.stats.streams_cancelled == 1)


def test_stall_mid_reuses_stall_after_as_the_tokens_sent_first(url: str) -> None:
    body = chat(stream=True, text="[fake fault=stall_mid stall_after=1]")
    _, received, error = stream_until_error(url, body, read_s=0.3)
    assert isinstance(error, httpx.ReadTimeout)
    assert stream_content(sse_data(received.decode()))[0] == "t0 "


def test_stall_mid_completion_sends_nothing(url: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        post(url, chat("stall_mid"), read_s=0.3)


def test_kill_mid_stream_drops_the_connection_after_some_tokens(url: str) -> None:
    status, received, error = stream_until_error(url, chat("kill_mid", stream=True))
    assert status == 200 and isinstance(error, httpx.RemoteProtocolError)
    assert "incomplete chunked read" in str(error)
    assert stream_content(sse_data(received.decode())) == ("t0 t1 t2 ", [None, None, None])


def test_kill_mid_completion_announces_more_bytes_than_it_sends(url: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match=r"received \d+ bytes, expected \d+"):
        post(url, chat("kill_mid"))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "completion"])
def test_scripted_status_answers_an_openai_error_object(url: str, stream: bool) -> None:
    response = post(url, {**chat(stream=stream), "messages": [{"role": "user", "content": "[fake status=500]"}]})
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"


def test_garbage_server_answers_bytes_that_are_not_http() -> None:
    async def scenario() -> bytes:
        server = await start_garbage_server()
        try:
            port = server.sockets[0].getsockname()[1]
            async with httpx.AsyncClient(timeout=2.0) as client:
                with pytest.raises(httpx.RemoteProtocolError):
                    await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat())
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            raw = await reader.read()  # until the server closes
            writer.close()
            return raw
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(asyncio.wait_for(scenario(), 5.0)) == GARBAGE


def test_runtime_script_changes_faults_for_later_requests_and_can_clear_them(url: str) -> None:
    assert httpx.get(f"{url}/fake/script").json()["fault"] == ""
    changed = httpx.post(f"{url}/fake/script", json={"fault": "html", "tokens": 2})
    assert changed.status_code == 200 and changed.json() | {"fault": "html", "tokens": 2} == changed.json()
    assert httpx.get(f"{url}/fake/script").json() == changed.json()
    assert post(url, chat()).headers["content-type"].startswith("text/html")
    assert httpx.post(f"{url}/fake/script", json={"fault": ""}).json()["tokens"] == 2  # other fields stay
    assert post(url, chat()).json()["choices"][0]["message"]["content"] == "t0 t1 "


@pytest.mark.parametrize("patch", [{"fault": "nope"}, {"tokens": "many"}, {"colour": "red"}, [1], "{not json"])
def test_runtime_script_rejects_bad_input_with_a_400_and_keeps_the_script(url: str, patch: object) -> None:
    content = patch.encode() if isinstance(patch, str) else msgspec.json.encode(patch)
    response = httpx.post(f"{url}/fake/script", content=content)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{url}/fake/script").json() == msgspec.to_builtins(FakeScript(tokens=6))


def test_directive_fault_applies_to_its_request_only(url: str) -> None:
    assert post(url, chat("truncated")).json()["choices"][0]["finish_reason"] is None
    assert post(url, chat()).json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "completion"])
def test_a_usage_directive_makes_the_engine_report_that_usage_instead_of_its_counts(url: str, stream: bool) -> None:
    lie = {"prompt_tokens": -5, "completion_tokens": 10**12}
    body = chat(stream=stream, text='hi [fake usage={"prompt_tokens":-5,"completion_tokens":1000000000000}]')
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = post(url, body)
    usage = json.loads(sse_data(response.text)[-2])["usage"] if stream else response.json()["usage"]
    assert response.status_code == 200 and usage == lie


def test_directive_with_an_unknown_fault_is_a_400(url: str) -> None:
    response = post(url, chat("explode"))
    assert response.status_code == 400 and "explode" in response.json()["error"]["message"]


def test_stats_count_the_requests_answered_with_each_fault(url: str, engine: FakeEngine) -> None:
    for body in (chat("html"), chat("html", stream=True), chat("truncated"), chat(), chat(text="[fake status=503]")):
        post(url, body)
    assert httpx.get(f"{url}/fake/stats").json()["faults"] == {"html": 2, "truncated": 1, "status_503": 1}


def test_unknown_fault_is_refused_by_the_script_and_the_cli() -> None:
    with pytest.raises(ValueError, match="fault must be one of"):
        FakeScript(fault="explode")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fake-server", "--fault", "explode"])
    for mode in (*FAULTS, "garbage"):  # the CLI's list is kept in step with the engine's
        assert build_parser().parse_args(["fake-server", "--fault", mode]).fault == mode


def test_fault_soak_runs_end_to_end_and_reports_every_request() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.soaks.fault", "--n", "40", "--concurrency", "4",
         "--fault-every-s", "0.5", "--fault-duration-s", "0.5", "--client-timeout-s", "5"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["requests"] == 40
    counts = ("ok_correct", "broken_success", "error_reported", "hung", "lost")
    assert sum(report[k] for k in counts) == 40
    assert {"served_by_failover", "failover_added_latency_ms_p99", "faults_injected", "duration_s",
            "gateway_metrics"} <= report.keys()
