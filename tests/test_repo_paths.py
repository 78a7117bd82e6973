"""cascade/repo_paths.py: what results, cards and profiles record for a path, and a scan of the repo's committed
artifacts for paths that only one machine has (issue 51 item 6)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cascade import repo_paths
from cascade.repo_paths import OUTSIDE, REPO_ROOT, recorded_path, recorded_value, recorded_values

ROOT = Path(__file__).resolve().parents[1]
# Folders whose files are artifacts another checkout reads: results, model and router cards, profiles, outcomes,
# example configs, and the docs that cite them.
ARTIFACT_DIRS = ("benchmarks/results", "models", "docs", "examples")
ARTIFACT_SUFFIXES = {".json", ".jsonl", ".md", ".toml", ".csv"}
# An absolute path into a machine's own folders; a path that merely ends in such a word ("benchmarks/soaks/worker_drift.py",
# "~/.cache/...") is not one.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|root|home|work|Users|mnt|var/folders)/")


def test_the_repo_root_is_this_checkout() -> None:
    assert REPO_ROOT == ROOT


def test_a_file_inside_the_repo_is_recorded_relative_to_its_root(monkeypatch, tmp_path) -> None:
    path = ROOT / "models" / "outcomes" / "qwen15-train-bench" / "sc-t07" / "branches.jsonl"
    assert recorded_path(path) == "models/outcomes/qwen15-train-bench/sc-t07/branches.jsonl"
    assert recorded_path(str(path)) == recorded_path(path)
    assert recorded_path(ROOT) == "."
    monkeypatch.chdir(ROOT / "benchmarks")  # a relative path is taken from the working directory
    assert recorded_path("../models/x.json") == "models/x.json"
    assert recorded_path("results/y.json") == "benchmarks/results/y.json"


def test_a_file_under_the_shared_data_folder_is_recorded_beside_the_repo(monkeypatch, tmp_path) -> None:
    shared = tmp_path / "data"
    monkeypatch.setenv("CASCADE_SHARED_DATA", str(shared))
    assert recorded_path(shared / "gsm8k" / "train.jsonl") == "../shared/data/gsm8k/train.jsonl"
    assert recorded_path(shared) == "../shared/data"


def test_a_file_elsewhere_is_recorded_by_its_name_and_says_it_is_not_in_the_repo(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CASCADE_SHARED_DATA", str(tmp_path / "shared"))
    assert recorded_path("/work/runs31/sc15_t07_branches.jsonl") == "sc15_t07_branches.jsonl" + OUTSIDE
    assert recorded_path(tmp_path / "out.json") == "out.json (not in the repo)"
    monkeypatch.chdir(tmp_path)
    assert recorded_path("relative.json") == "relative.json" + OUTSIDE
    assert recorded_path(ROOT / ".." / "elsewhere" / "b.jsonl") == "b.jsonl" + OUTSIDE  # `..` leaves the repo


def test_a_link_inside_the_repo_is_recorded_where_it_is_not_where_it_points(monkeypatch, tmp_path) -> None:
    repo, target = tmp_path / "repo", tmp_path / "cache" / "model"
    (repo / "models").mkdir(parents=True)
    target.mkdir(parents=True)
    (repo / "models" / "linked").symlink_to(target)
    monkeypatch.setattr(repo_paths, "REPO_ROOT", repo)
    assert recorded_path(repo / "models" / "linked" / "w.bin") == "models/linked/w.bin"


def test_a_link_outside_the_repo_that_points_into_it_is_recorded_in_the_repo(tmp_path) -> None:
    link = tmp_path / "examples"
    link.symlink_to(ROOT / "examples")
    assert recorded_path(link / "problem-cascadia.toml") == "examples/problem-cascadia.toml"


@pytest.mark.parametrize("value", ["gsm8k", "gsm8k-train", "cascade", "http://127.0.0.1:8000/v1", "runs/nothing-here",
                                   "", 3, 0.5, None, True])
def test_names_urls_and_numbers_pass_unchanged(value: object) -> None:
    assert recorded_value(value) == value


def test_paths_among_values_are_recorded(tmp_path) -> None:
    assert recorded_value(ROOT / "examples") == "examples"
    assert recorded_value(str(ROOT / "examples")) == "examples"
    assert recorded_value("/root/.cache/cascade-bench") == "cascade-bench" + OUTSIDE
    tree = {"out": tmp_path / "r.json", "dataset": "gsm8k", "n": 3,
            "command": ("python", str(ROOT / "cascade" / "cli.py"), "--port", "8000"), "nested": [{"spec": None}]}
    assert recorded_values(tree) == {"out": "r.json" + OUTSIDE, "dataset": "gsm8k", "n": 3,
                                     "command": ["python", "cascade/cli.py", "--port", "8000"],
                                     "nested": [{"spec": None}]}


def _artifacts() -> list[Path]:
    files = [p for d in ARTIFACT_DIRS for p in sorted((ROOT / d).rglob("*"))
             if p.is_file() and p.suffix in ARTIFACT_SUFFIXES]
    assert len(files) > 100  # the scan reads the repo's artifacts, not an empty folder
    return files


def test_the_machine_path_pattern_finds_what_it_must_and_nothing_else() -> None:
    found = ['"/work/runs31/b.jsonl"', "/tmp/x.json", "(/root/.cache/cascade)", " /home/u/d", "'/Users/a/b'"]
    kept = ["benchmarks/soaks/worker_drift.py", "cascade/optimizer/widths.py", "~/.cache/cascade/models",
            "../shared/data/gsm8k/train.jsonl", "runs/tmp/x", "http://127.0.0.1/work/a"]
    assert all(MACHINE_PATH.search(text) for text in found)
    assert not any(MACHINE_PATH.search(text) for text in kept)


def test_no_committed_artifact_names_a_path_on_one_machine() -> None:
    """Results, cards, profiles, outcomes and docs record repo-relative paths (cascade/repo_paths.py). No allow-list:
    a file that needs one explains why here."""
    offending = []
    for path in _artifacts():
        with path.open(encoding="utf-8", errors="replace") as text:
            for number, line in enumerate(text, start=1):
                if (match := MACHINE_PATH.search(line)) is not None:
                    where = line[max(0, match.start() - 40):match.end() + 40].strip()
                    offending.append(f"{path.relative_to(ROOT)}:{number}: ...{where}...")
    assert not offending, "machine paths in committed artifacts:\n" + "\n".join(offending)
