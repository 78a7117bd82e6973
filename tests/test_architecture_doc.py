"""docs/architecture.md stays true to the tree: every repository path it names in backticks exists, every package and
top-level module under cascade/ is named in it, and the import contracts it names are exactly pyproject.toml's.

The page's convention (its first paragraph): a module or package by its repo path in backticks (`cascade/service/
lease.py`, `cascade/service/keys/`), a contract by its pyproject.toml `name` in double quotes at the start of a list
item. A module renamed or moved without the page fails here.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
# Backticked repo paths: `cascade/...`, `loadgen/`, `benchmarks/...`, `tests/...`, `models/`, ... (no spaces).
PATH = re.compile(r"`((?:cascade|loadgen|benchmarks|tests|models|examples|scripts|docs)/[^`\s]*)`")
CONTRACT = re.compile(r'^- "([^"]+)"', re.M)
# Links from any doc into measured.md and architecture.md, for the anchor check.
ANCHOR_LINK = re.compile(r"\((?:[./a-z]*/)?(measured|architecture)\.md#([a-z0-9-]+)\)")


def _text() -> str:
    return PAGE.read_text()


def _tracked(under: str) -> list[str]:
    done = subprocess.run(["git", "ls-files", under], capture_output=True, text=True, cwd=ROOT, check=True)
    return done.stdout.split()


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def test_every_path_the_page_names_exists() -> None:
    named = named_paths(_text())
    assert len(named) > 50, "the page's convention changed: update PATH"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that are not in the tree: {missing}"


def test_named_directories_end_with_a_slash_and_modules_are_files() -> None:
    for path in named_paths(_text()):
        target = ROOT / path
        if path.endswith("/"):
            assert target.is_dir(), f"`{path}` is written as a package but is not a directory"
        elif target.exists():
            assert target.is_file(), f"`{path}` is a directory: write it as `{path}/`"


def test_every_package_and_top_level_module_under_cascade_is_named() -> None:
    named = named_paths(_text())
    files = _tracked("cascade")
    packages = {str(Path(f).parent) + "/" for f in files if f.endswith(".py")}
    top_level = {f for f in files if f.count("/") == 1 and f.endswith(".py") and not f.endswith("__init__.py")}
    missing = sorted((packages | top_level) - named)
    assert not missing, f"docs/architecture.md does not name: {missing} (its Layout lists every package)"


def test_the_contracts_named_are_exactly_pyprojects() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = {c["name"] for c in config["tool"]["importlinter"]["contracts"]}
    named = set(CONTRACT.findall(_text()))
    assert named, "the page's convention changed: update CONTRACT"
    assert not named - contracts, f"named on the page but not in pyproject.toml: {sorted(named - contracts)}"
    assert not contracts - named, f"in pyproject.toml but not explained on the page: {sorted(contracts - named)}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but hyphens and underscores dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_links_into_measured_and_architecture_resolve() -> None:
    """Every number is stated once, in docs/measured.md, and linked from elsewhere: the links must land."""
    anchors = {name: _anchors((ROOT / "docs" / f"{name}.md").read_text()) for name in ("measured", "architecture")}
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]:
        for page, anchor in ANCHOR_LINK.findall(doc.read_text()):
            if anchor not in anchors[page]:
                broken.append(f"{doc.relative_to(ROOT)} -> {page}.md#{anchor}")
    for page, found in anchors.items():  # and each page's links to its own sections
        for anchor in re.findall(r"\]\(#([a-z0-9-]+)\)", (ROOT / "docs" / f"{page}.md").read_text()):
            if anchor not in found:
                broken.append(f"docs/{page}.md -> #{anchor}")
    assert not broken, broken


def test_the_check_fails_for_a_renamed_module() -> None:
    """The page as it would read after a rename it missed."""
    stale = _text().replace("`cascade/service/lease.py`", "`cascade/service/leases.py`")
    assert "cascade/service/leases.py" in {p for p in named_paths(stale) if not (ROOT / p).exists()}
