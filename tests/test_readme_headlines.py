"""README.md states no number of its own: its Measured table copies each figure from docs/measured.md, where every
number is stated once with its setup, command and caveats, and the README stays short (issue 60: <= 250 lines)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MEASURED = ROOT / "docs" / "measured.md"
# A figure as written: signed decimals, intervals (0.611-0.760, -0.070..-0.003), ratios (0.58x), thousands (1,000).
FIGURE = re.compile(r"[+-]?\d[\d,]*\.\d+(?:(?:-|\.\.)[+-]?\d[\d,]*\.\d+)?x?")


def _measured_table_rows() -> list[tuple[str, str]]:
    text = README.read_text()
    section = text[text.index("## Measured"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| \[[^\]]+\]\((docs/measured\.md#[a-z0-9-]+)\) \| (.+) \|$", section, re.M)
    assert rows, "README's Measured table moved: update this parser"
    return rows


def test_every_readme_headline_figure_is_stated_in_docs_measured() -> None:
    measured = MEASURED.read_text()
    missing = [(link, figure) for link, cell in _measured_table_rows() for figure in FIGURE.findall(cell)
               if figure not in measured]
    assert not missing, f"README figures not stated as such in docs/measured.md (copy them exactly): {missing}"


def test_the_readme_stays_short() -> None:
    assert len(README.read_text().splitlines()) <= 250
