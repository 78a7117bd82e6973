"""The docs' examples checked against the code (issue 65 item 5): every `cascade ...` command they show names a
subcommand that exists and only flags its parser accepts (built from cascade/cli.py, nothing run, values not
checked); every ```toml block parses, and its keys are cascade.toml's (cascade/config/, walked by msgspec's type
info), and every example file loads; every repo path and note they cite exists; the `/v1/route` outputs they show
use RouteDecision's field names (their values: tests/router/test_documented_routes.py), and their lists of the
`cascade` object's fields are CascadeInfo's.

Where the docs' text comes from and how commands are cut out of it: tests/docs_text.py.
"""

from __future__ import annotations

import argparse
import glob
import re
import subprocess
import tomllib
from functools import cache
from typing import Any

import msgspec.inspect as mi
import pytest

from cascade.cli import build_parser
from cascade.config import CascadeConfig, load_config
from cascade.optimizer.problem import load_problem
from cascade.schemas import CascadeInfo, RouteDecision
from tests.docs_text import (
    ROOT,
    Command,
    cited_notes,
    cited_paths,
    commands,
    doc_files,
    fenced_blocks,
    rel,
    shown_routes,
)

DOCS = doc_files()
MARKDOWN = [p for p in DOCS if p.suffix == ".md"]
# A subcommand written as a placeholder (`cascade <command> --help`): any subcommand.
PLACEHOLDER = re.compile(r"<[\w-]+>")
# Paths a doc cites that no checkout has, each with its reason. (A path git ignores, a run's local output such as
# branch texts that restate questions, passes without being listed: `git check-ignore`.)
GONE = {
    ("docs/history.md", "cascade/config.py"): "the history of the module that became the cascade/config/ package",
    ("benchmarks/README.md", "models/outcomes/qwen15-test-bench/sc/branches.jsonl"):
        "what the regeneration it describes writes, to be committed then (the old run's texts are gone)",
}


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def command_problems(command: Command, root: argparse.ArgumentParser) -> list[str]:
    """What is wrong with `command` for the `cascade` parser `root` (empty: nothing)."""
    parser, words, path = root, list(command.words), ["cascade"]
    while (sub := _subparsers(parser)) is not None and words and not words[0].startswith("-"):
        if PLACEHOLDER.fullmatch(words[0]):
            return []
        alternatives = words[0].split("|")  # `cascade keys add|list`
        unknown = [a for a in alternatives if a not in sub.choices]
        if unknown:
            if not sub.required:  # `cascade loadgen --url ...`: the action is optional, the word a value
                break
            return [f"`{' '.join(path)} {unknown[0]}`: no such subcommand (it has {', '.join(sub.choices)})"]
        parser = sub.choices[alternatives[0]]
        path.append(words.pop(0))
    accepted = parser._option_string_actions
    flags = [w.strip("[]").split("=", 1)[0] for w in words]
    return [f"`{' '.join(path)}` has no option `{flag}`" for flag in flags
            if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in accepted]


@cache
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_the_docs_show_enough_commands_that_a_change_in_how_they_are_written_shows_here() -> None:
    shown = [c for p in DOCS for c in commands(p)]
    assert len(shown) > 120, "fewer commands found than the docs hold: tests/docs_text.py missed a form"
    assert any(c.where.startswith("examples/") for c in shown) and any(c.where.startswith("scripts/") for c in shown)
    assert sum(len(c.words) > 4 for c in shown) > 30  # whole command lines, not only `cascade serve` in prose


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_command_a_doc_shows_is_one_the_cli_accepts(doc) -> None:
    problems = [f"{c}\n    {p}" for c in commands(doc) for p in command_problems(c, parser())]
    assert not problems, "commands the CLI would refuse:\n" + "\n".join(problems)


def test_a_wrong_subcommand_or_flag_is_caught() -> None:
    def problems(line: str) -> list[str]:
        return command_problems(Command("here", line.split()), parser())

    assert problems("keys add --name team-a --rpm 60") == []
    assert problems("keys add|list") == [] and problems("<command> --help") == []
    assert problems("loadgen --url U --out D") == [] and problems("loadgen compare a b --out c") == []
    assert problems("keys create") == ["`cascade keys create`: no such subcommand (it has add, list)"]
    assert problems("keys add NAME --nmae x") == ["`cascade keys add` has no option `--nmae`"]
    assert problems("serve --monitoring-port=1 [--plan P]") == []
    assert problems("router train --router r") == ["`cascade router train` has no option `--router`"]


# --- TOML ---------------------------------------------------------------------------------------------------------

def _struct_of(info: mi.Type, value: object) -> mi.StructType | None:
    """The config Struct that `value` (a TOML table) is decoded as where the schema expects `info` (None: a table of
    free keys, or not a table)."""
    if isinstance(info, mi.StructType):
        return info
    if isinstance(info, mi.UnionType):
        structs = [t for t in info.types if isinstance(t, mi.StructType)]
        tagged = [t for t in structs if t.tag_field is not None and isinstance(value, dict)
                  and value.get(t.tag_field) == t.tag]
        return (tagged or structs or [None])[0]
    return None


def unknown_keys(table: dict[str, Any], info: mi.StructType, path: str = "") -> list[str]:
    """The dotted keys of `table` that the config Struct `info` and the Structs under it do not have."""
    fields = {f.encode_name: f.type for f in info.fields}
    out = []
    for key, value in table.items():
        where = f"{path}{key}"
        if key == info.tag_field:
            continue
        if key not in fields:
            out.append(where)
            continue
        kind = fields[key]
        items = kind.item_type if isinstance(kind, (mi.ListType, mi.VarTupleType)) else None
        if isinstance(kind, mi.DictType):  # `{ name = Struct }` tables: each value
            values = value.values() if isinstance(value, dict) else []
            out += [k for v in values if isinstance(v, dict) and (s := _struct_of(kind.value_type, v))
                    for k in unknown_keys(v, s, where + ".*.")]
        elif items is not None:  # `[[tiers]]`, or one `[tiers.x]` table standing for a tier in a fragment
            for element in value if isinstance(value, list) else [value]:
                if isinstance(element, dict) and (s := _struct_of(items, element)):
                    out += unknown_keys(element, s, where + ".")
        elif isinstance(value, dict) and (s := _struct_of(kind, value)):
            out += unknown_keys(value, s, where + ".")
    return out


def _toml_blocks() -> list[tuple[str, str]]:
    return [(b.where, b.text) for p in MARKDOWN for b in fenced_blocks(p) if b.lang == "toml"]


@pytest.mark.parametrize(("where", "text"), _toml_blocks(), ids=[w for w, _ in _toml_blocks()])
def test_every_toml_block_parses_and_names_only_cascade_toml_keys(where, text) -> None:
    table = tomllib.loads(text)  # a fragment as shown: `# ...` comment lines stand for the rest
    unknown = unknown_keys(table, mi.type_info(CascadeConfig))
    assert not unknown, f"{where}: keys cascade.toml does not have: {unknown}"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.toml")), ids=rel)
def test_every_example_file_loads_as_what_its_commands_read_it_as(example) -> None:
    """A problem-*.toml is `cascade optimize plan --spec`'s; every other example is a cascade.toml."""
    if example.name.startswith("problem-"):
        load_problem(example)
    else:
        load_config(example)


def test_the_key_walk_finds_a_misspelt_key_at_any_depth() -> None:
    config = mi.type_info(CascadeConfig)
    assert unknown_keys({"routing": {"mode": "cascade", "confidence": {"source": "x"}}}, config) == []
    assert unknown_keys({"routing": {"confidense": {}}}, config) == ["routing.confidense"]
    assert unknown_keys({"tiers": [{"name": "a", "backends": [{"kind": "sglang", "url": "u", "modle": "m"}]}]},
                        config) == ["tiers.backends.modle"]
    assert unknown_keys({"tiers": {"branches": {"n": 8, "mm": 2}}}, config) == ["tiers.branches.mm"]
    assert unknown_keys({"routing": {"effort": {"low": {"quality": "fast", "branchs": 1}}}}, config) == \
        ["routing.effort.low.branchs"]


# --- paths ----------------------------------------------------------------------------------------------------------

def _ignored(path: str) -> bool:
    """Whether git ignores `path` (a local output the docs name so that a reader can make it)."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False).returncode == 0


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_repo_path_a_doc_cites_exists(doc) -> None:
    cited = cited_paths(doc)
    missing = [f"{where}: {path}" for where, path in cited if (rel(doc), path) not in GONE
               and not glob.glob(str(ROOT / path)) and not _ignored(path)]
    assert not missing, "paths cited that are not in the repo:\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_note_a_doc_cites_by_name_is_in_the_repo(doc) -> None:
    """`FACTS.md`, `PAPERS.md` and the design notes live beside the repo, not in it: a reader of a checkout has none."""
    missing = [f"{where}: {name}" for where, name in cited_notes(doc)
               if not (doc.parent / name).exists() and not (ROOT / name).exists()]
    assert not missing, "notes cited that are not in the repo:\n" + "\n".join(missing)


def test_paths_are_read_from_prose_code_spans_and_links_with_braces_expanded() -> None:
    assert len([p for doc in DOCS for p in cited_paths(doc)]) > 400
    readme = [path for _, path in cited_paths(ROOT / "README.md")]
    assert "docs/commands.md" in readme  # a link
    measured = {path for _, path in cited_paths(ROOT / "docs" / "measured.md")}
    assert {"benchmarks/results/plan_widths_embedded_reason.json",
            "benchmarks/results/plan_widths_embedded.json"} <= measured


# --- /v1/route ------------------------------------------------------------------------------------------------------

def test_the_route_outputs_shown_use_the_route_decisions_field_names() -> None:
    shown = shown_routes()
    assert len(shown) >= 2, "docs/configuration.md's /v1/route examples moved: update tests/docs_text.py shown_routes"
    fields = {f.encode_name for f in mi.type_info(RouteDecision).fields}
    for where, _, text in shown:
        named = re.findall(r'"(\w+)":', text)
        assert named, f"{where}: no fields read from {text!r}"
        assert set(named) <= fields, f"{where}: not RouteDecision fields: {sorted(set(named) - fields)}"


def test_an_out_of_domain_route_output_shows_the_note_that_says_why() -> None:
    for where, _, text in shown_routes():
        if '"out_of_domain":true' in text.replace(" ", ""):
            assert '"note":' in text, f"{where}: an out-of-domain decision is shown without its note"



def test_the_cascade_objects_fields_the_docs_list_are_its_own() -> None:
    """A doc's "`cascade` object (tier, difficulty, ...)": each name listed is a CascadeInfo field."""
    fields = {f.encode_name for f in mi.type_info(CascadeInfo).fields}
    lists = [(rel(doc), listed) for doc in MARKDOWN
             for listed in re.findall(r"`?cascade`?\s+object\s+\(([^)]*)\)", doc.read_text())]
    assert len(lists) >= 2, "the docs' lists of the cascade object's fields moved: update this test"
    wrong = [(where, name) for where, listed in lists for name in re.findall(r"[a-z_]+", listed) if name not in fields]
    assert not wrong, f"names listed as the cascade object's fields that are not CascadeInfo's: {wrong}"
