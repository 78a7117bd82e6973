"""The shared data files tests read in place (../shared/data beside the clone, or $CASCADE_SHARED_DATA).

CI always has the shared folder, so a missing file is a broken setup, not a reason to skip: `shared_file`
fails the test and names the path it looked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cascade.data.datasets import shared_data_dir


def shared_file(*parts: str) -> Path:
    path = shared_data_dir().joinpath(*parts)
    if not path.exists():
        pytest.fail(f"shared data missing: {path} (put ../shared beside the clone or set CASCADE_SHARED_DATA)",
                    pytrace=False)
    return path
