"""The SGLang protocol models the contract tests check against (tests/contract/sglang_protocol.py)."""

from __future__ import annotations

import os
import types

import pytest

from tests.contract.sglang_protocol import SGLangProtocol, load, load_sampling_params, missing


def _installed() -> None:
    if (why := missing()) is not None:
        # CI installs the pinned wheel (make install-test): there a missing one is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="session")
def sglang() -> SGLangProtocol:
    _installed()
    return load()


@pytest.fixture(scope="session")
def sampling_params(sglang: SGLangProtocol) -> types.ModuleType:
    """SGLang's `sampling_params` module (after `sglang`: one import of the wheel at a time)."""
    return load_sampling_params()
