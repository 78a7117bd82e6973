"""Priced tiers for the tests of cost and budgets (tests/service/keys/test_costs.py, keys/test_budgets.py, test_lease.py and
tests/gateway/test_redis_budgets.py): ladder_toml's three tiers with round prices, so that costs are exact sums."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec

from cascade.config import decode_config
from cascade.gateway.server import Gateway
from cascade.service.keys.costs import MTOK
from cascade.testing.asgi import serve_asgi
from cascade.testing.fakes.engine import FakeEngine, FakeScript
from cascade.testing.servers import TIERS, ladder_toml

# Per million tokens, input and output, cheapest tier first.
PRICES = ((1.0, 2.0), (10.0, 20.0), (100.0, 200.0))


def priced(toml: str, prices: tuple[tuple[float, float], ...] = PRICES, currency: str = "USD") -> str:
    """`toml` (ladder_toml's) with a `price` on each tier."""
    for name, (price_in, price_out) in zip(TIERS, prices, strict=True):
        line = f'name = "{name}"\n'
        table = f'price = {{ input_per_mtok = {price_in}, output_per_mtok = {price_out}, currency = "{currency}" }}\n'
        toml = toml.replace(line, line + table, 1)
    return toml


def expected(by_tier: dict[str, tuple[int, int]]) -> float:
    """The cost of (prompt, decoded) tokens per tier at PRICES."""
    prices = dict(zip(TIERS, PRICES, strict=True))
    return sum(p * prices[t][0] / MTOK + c * prices[t][1] / MTOK for t, (p, c) in by_tier.items())


def last_chunk(body: bytes) -> dict:
    """The last `data:` event of an SSE body before `[DONE]`."""
    events = [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]
    return msgspec.json.decode(events[-2] if events[-1] == b"[DONE]" else events[-1])


@contextmanager
def running_priced_gateway(toml: Callable[[str], str] = priced) -> Iterator[str]:
    """A gateway (`cascade serve`'s app) over real HTTP in front of the fake engine, its config rewritten by `toml`
    (by default: its tiers priced)."""
    with serve_asgi(FakeEngine(FakeScript(tokens=8))) as engine_url:
        gateway = Gateway(decode_config(toml(ladder_toml(engine_url))))
        with serve_asgi(gateway.app, lifespan="on") as url:
            yield url
