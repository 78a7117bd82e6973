"""Fixtures shared across test packages (`router_dir`, a small learned router trained once per module), and how
`make test`'s workers (pytest-xdist, `--dist loadgroup`) share the suite out."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from cascade.cli import main
from cascade.testing.servers import TIERS

REAL_MODELS_GROUP = "real-models"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`: a file's tests stay on one worker (its module fixtures, a gateway or a trained
    router, start once), and every real-model test runs on the same worker, so two model ladders never share the
    two cores and their memory (the other worker runs the light tests beside them)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    _name_each_schemathesis_operation(items)
    repeated = [nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1]
    if repeated:  # xdist's grouping schedules by node id: a repeated one would run once, silently
        raise pytest.UsageError(f"test ids collected more than once (they would run once on workers): {repeated}")
    for item in items:
        group = REAL_MODELS_GROUP if item.get_closest_marker("e2e") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


def _name_each_schemathesis_operation(items: list[pytest.Item]) -> None:
    """schemathesis names its items `test[POST /path]`, but on pytest 9.2 every one gets the test's bare node id
    (its items pass `originalname` and no parameters); give each its operation as the id's parameters."""
    for item in items:
        label = getattr(item, "operation_label", None)
        node_id = getattr(item, "_id", None)
        if label and node_id is not None and getattr(node_id, "params", "") is None:
            item._id = dataclasses.replace(node_id, params=label)


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
