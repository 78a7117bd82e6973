"""The traffic log: one line per served request with the router's outputs, tier and tokens; no text."""

from __future__ import annotations

import httpx

from cascade.service.traffic import read_traffic
from cascade.testing.servers import TIERS
from tests.gateway.gateway_setup import post_chat, running_gateway, user


def test_every_served_request_is_logged_without_its_text(tmp_path) -> None:
    path = tmp_path / "logs" / "traffic.jsonl"
    extra = f'[gateway]\ntraffic_log = "{path}"\n'
    with running_gateway(extra=extra) as (base, _, _):
        assert post_chat(base, {"model": "cascade:best", "messages": user("secret question 17")}).status_code == 200
        body = {"model": "cascade:fast", "messages": user("secret question 18"), "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=10) as response:
            b"".join(response.iter_bytes())
        assert post_chat(base, {"model": "nope", "messages": user()}).status_code == 404  # not served: not logged
    records = read_traffic(path)
    assert [(r.hint, r.tier_name, r.stream) for r in records] == [("best", TIERS[2], False), ("fast", TIERS[0], True)]
    assert all(r.completion_tokens == 8 and r.latency_s > 0 and r.router == "heuristic" for r in records)
    assert records[0].difficulty is not None and records[0].route_score == records[0].difficulty
    assert b"secret" not in path.read_bytes()
