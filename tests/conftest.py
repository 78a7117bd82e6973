"""Fixtures shared across test packages (`router_dir`, a small learned router trained once per module), and how
`make test`'s workers (pytest-xdist) share the suite out."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cascade.cli import main
from cascade.testing.servers import TIERS

# Files that hold real-model (`e2e`) tests. Under `make test`'s workers (`-n 2 --dist loadfile`) each file's tests
# run on one worker, in order (a module's gateway, ladder or trained router starts once), and these files all run
# on the same worker, so two model ladders never share the two cores and their memory (the other worker runs the
# light tests beside them).
REAL_MODEL_FILES = ("tests/e2e/", "tests/benchmarks/reasoning/test_verifier_scorer.py")
REAL_MODELS_SCOPE = "real-models"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with every real-model file in one scope. (xdist's `loadgroup` would need its group marks
    in the node ids, which it writes to `item._nodeid`, an attribute pytest 9.2 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesWithRealModelsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return REAL_MODELS_SCOPE if path.startswith(REAL_MODEL_FILES) else path

    return FilesWithRealModelsTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: every real-model test lives in REAL_MODEL_FILES, and every node id is collected once (the
    scheduler hands out tests by node id: a repeated one would run once, silently)."""
    if not hasattr(config, "workerinput"):
        return
    _name_each_schemathesis_operation(items)
    strays = [item.nodeid for item in items
              if item.get_closest_marker("e2e") and not item.nodeid.startswith(REAL_MODEL_FILES)]
    if strays:
        raise pytest.UsageError(f"real-model tests outside tests/conftest.py's REAL_MODEL_FILES: {strays}")
    repeated = [nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1]
    if repeated:
        raise pytest.UsageError(f"test ids collected more than once (they would run once on workers): {repeated}")


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
