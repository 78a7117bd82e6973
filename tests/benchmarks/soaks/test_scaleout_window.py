"""benchmarks/soaks/scaleout.py's kill window: which failed requests the SIGKILL of gateway 0 excuses. Only those in
flight while it died, and, for ENVOY_NOTICE_S after its reaping, a 503 whose cause is Envoy writing to one of its
closed connections; any other failure stays a failure."""

from __future__ import annotations

from benchmarks.soaks import scaleout as soak

KILL, DEAD = 10.0, 10.004
CLOSED = ("stream=False status=503  b'{\"error\":{\"code\":\"upstream_unavailable\",\"message\":\"upstream connect "
          "error or disconnect/reset before headers. reset reason: connection termination\"}}'")


def outcome(started: float, ended: float, status: int | None = 503, detail: str = CLOSED) -> object:
    return soak.Outcome("error_reported", status, started, ended, detail, marker="soak-1")


def test_a_request_in_flight_while_the_gateway_died_is_in_the_window() -> None:
    assert soak.in_kill_window(outcome(9.0, 10.001, 200, ""), KILL, DEAD)
    assert soak.in_kill_window(outcome(10.002, 10.5, None, "cut"), KILL, DEAD)


def test_a_request_over_before_the_kill_or_begun_after_it_for_another_cause_is_not() -> None:
    assert not soak.in_kill_window(outcome(9.0, 9.99), KILL, DEAD)
    assert not soak.in_kill_window(outcome(10.01, 10.02, 503, "no healthy upstream"), KILL, DEAD)
    assert not soak.in_kill_window(outcome(10.01, 10.02, None, "cut"), KILL, DEAD)


def test_envoy_writing_to_a_closed_connection_just_after_the_reaping_is_the_kills_for_a_bounded_time() -> None:
    assert soak.in_kill_window(outcome(DEAD + 0.0035, DEAD + 0.006), KILL, DEAD)
    assert soak.in_kill_window(outcome(DEAD + soak.ENVOY_NOTICE_S, DEAD + 1), KILL, DEAD)
    assert not soak.in_kill_window(outcome(DEAD + soak.ENVOY_NOTICE_S + 0.001, DEAD + 1), KILL, DEAD)
