"""The OpenAI wire format: SSE events across reads, chunks as deltas, error bodies as CascadeErrors."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cascade.branches import openai_wire
from cascade.branches.openai_wire import EventData, error_message, parse_chunk, status_error
from cascade.errors import BackendFailed, BackendUnavailable, InvalidRequest, Overloaded

CHUNK = b'{"choices":[{"index":0,"delta":{"content":"t0 "},"finish_reason":null}]}'


def test_an_event_split_across_reads_is_whole_once_its_line_ends() -> None:
    events = EventData()
    assert events.feed(b"data: " + CHUNK[:10]) == []
    assert events.feed(CHUNK[10:] + b"\n\n: keep-alive\n\ndata: {}\n") == [CHUNK, b"{}"]


def test_done_ends_the_events_but_not_the_reading() -> None:
    events = EventData()
    assert events.feed(b"data: " + CHUNK + b"\n\ndata: [DONE]\n\ndata: " + CHUNK + b"\n\n") == [CHUNK]
    assert events.done and events.tail() == b""


def test_a_last_event_without_its_newline_is_the_tail() -> None:
    events = EventData()
    assert events.feed(b"data: " + CHUNK) == [] and events.tail() == CHUNK


def test_a_chunk_is_a_delta_and_a_role_only_chunk_is_none() -> None:
    delta = parse_chunk(CHUNK, "b")
    assert delta is not None and (delta.text, delta.chunks, delta.finish_reason) == ("t0 ", 1, None)
    assert parse_chunk(b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}', "b") is None


@pytest.mark.parametrize(("data", "error"), [
    (b"{oops", BackendFailed),
    (b'{"error": {"message": "Request waiting timeout reached.", "code": 503}}', BackendUnavailable),
    (b'{"error": "boom"}', BackendFailed),
])
def test_unreadable_and_in_band_error_chunks_raise(data: bytes, error: type) -> None:
    with pytest.raises(error):
        parse_chunk(data, "b")


@pytest.mark.parametrize(("status", "error"), [(400, InvalidRequest), (429, Overloaded), (503, BackendUnavailable),
                                               (500, BackendFailed)])
def test_statuses_map_to_errors_with_the_engines_message(status: int, error: type) -> None:
    raised = status_error("b", status, b'{"error": {"message": "context too long"}}')
    assert isinstance(raised, error) and "context too long" in raised.message


def test_error_messages_are_read_from_every_shape_and_bounded() -> None:
    assert error_message(b'{"message": "m"}') == "m"
    assert error_message(b'{"detail": "d"}') == "d"
    assert error_message(b"<html>" + b"x" * 1000) == "<html>" + "x" * 294
    assert error_message(b"") == "(empty body)"


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.just(b"data: " + CHUNK), st.just(b"data: [DONE]"),
                          st.just(b"\n" * 500), st.just(b"data: " + b"x" * 5000)), max_size=12),
       st.lists(st.integers(0, 20_000), max_size=30))
def test_how_a_body_is_split_across_reads_never_changes_its_events(lines: list[bytes], cuts: list[int]) -> None:
    body = b"\n".join(lines)
    whole = EventData()
    expected = whole.feed(body)
    pieces = EventData()
    got = [payload for piece in split_at(body, cuts) for payload in pieces.feed(piece)]
    assert got == expected and pieces.done == whole.done and pieces.tail() == whole.tail()


def test_a_line_past_the_limit_is_a_backend_failure_whether_it_arrives_whole_or_in_pieces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_wire, "MAX_EVENT_BYTES", 1000)
    trickle = EventData("small/0")
    trickle.feed(b"data: " + CHUNK + b"\n\ndata: ")  # earlier events do not count toward the line
    for _ in range(99):
        trickle.feed(b"x" * 10)  # 6 + 990 bytes held: within the limit
    with pytest.raises(BackendFailed, match=r"small/0.*stream line over 1000 bytes"):
        trickle.feed(b"x" * 10)
    with pytest.raises(BackendFailed, match="stream line over 1000 bytes"):
        EventData().feed(b"data: " + b"x" * 1000 + b"\n")  # a whole line in one read
    assert EventData().feed(b"data: " + b"x" * 994 + b"\n") == [b"x" * 994]  # exactly the limit passes
