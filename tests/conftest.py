"""Fixtures shared across test packages: `router_dir`, a small learned router trained once per module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cascade.cli import main
from cascade.testing.servers import TIERS


@pytest.fixture(scope="module")
def router_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-tier router trained on seeded outcomes where long, number-heavy prompts defeat cheap tiers."""
    rng = np.random.default_rng(0)
    rows = ["prompt," + ",".join(TIERS)]
    for _ in range(300):
        k = int(rng.integers(1, 7))
        prompt = ". ".join(f"Sam buys {int(rng.integers(2, 99))} apples for ${int(rng.integers(1, 9))} each"
                           for _ in range(k)) + ". How much does he pay in total?"
        ok = [rng.random() < 1.0 - 0.16 * k, rng.random() < 1.0 - 0.08 * k, rng.random() < 0.98 - 0.02 * k]
        rows.append(f'"{prompt}",' + ",".join(str(v) for v in ok))
    tmp = tmp_path_factory.mktemp("learned")
    (tmp / "outcomes.csv").write_text("\n".join(rows) + "\n")
    out = tmp / "router"
    assert main(["router", "train", "--outcomes", str(tmp / "outcomes.csv"), "--tiers", ",".join(TIERS),
                 "--out", str(out), "--cv-folds", "3"]) == 0
    return out
