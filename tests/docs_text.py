"""What the docs show that code can check: `cascade ...` command lines, fenced blocks, and the repo paths they cite
(read by tests/test_docs_commands.py). Plain text handling only: nothing here imports cascade.

The docs read are README.md, docs/*.md, benchmarks/README.md, the comments of examples/*.toml and scripts/*.sh (and those scripts' own
command lines). A command is taken from: a line of a shell-like fenced block whose first word is `cascade` (or a path
ending in `/cascade`), an inline code span that starts with `cascade `, and a comment line of an example or script
that runs one (`#   cascade serve --config ...`, `# then: cascade serve ...`). A line ending in a backslash goes on
on the next line (in a comment: on the next comment line).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)\s*$")
# A code span may wrap onto the next line (never across a blank one).
INLINE_COMMAND = re.compile(r"`((?:[^`\s]*/)?cascade [^`]+)`")
# A comment line that runs one: `cascade` indented as code (`#   cascade ...`) or after a lead-in (`# then: cascade`);
# `# cascade in front of ...` is prose.
COMMENT_COMMAND = re.compile(r"^(?:\s{2,}|.*?:\s+)((?:\S*/)?cascade\s+[a-z][\w-]*.*)$")
# Where a shell line's command ends: a pipe, a redirection, a background `&`, a list.
COMMAND_END = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}
# Repo paths as the docs cite them: `cascade/router/domain.py`, `examples/x.toml`, `benchmarks/router/`.
# A `{a,b}` in one stands for both (shell brace expansion).
REPO_PATH = re.compile(r"(?<![\w./-])((?:cascade|docs|examples|benchmarks|models|scripts|tests|loadgen|deploy)/"
                       r"(?:[\w./*-]|\{[\w.,-]*\})*[\w/*}])")
BRACES = re.compile(r"\{([\w.,-]*)\}")
# A note cited by its bare name (`FACTS.md`, `README.md`): in the doc's folder or at the root.
NOTE = re.compile(r"(?<![\w/.-])([A-Z][A-Z_]*\.md)\b")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


@dataclass(frozen=True)
class Fenced:
    where: str  # "docs/configuration.md:259" (the fence's first line)
    lang: str
    text: str


@dataclass(frozen=True)
class Command:
    where: str
    words: list[str]  # from `cascade`'s subcommand on: ["keys", "add", "--name", "NAME"]

    def __str__(self) -> str:
        return f"{self.where}: cascade {' '.join(self.words)}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "examples").glob("*.toml")), *sorted((ROOT / "scripts").glob("*.sh"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def fenced_blocks(path: Path) -> list[Fenced]:
    blocks, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        opened = FENCE.match(line)
        if lang is None and opened:
            lang, start, lines = opened.group(1), number, []
        elif lang is not None and line.strip() == "```":
            blocks.append(Fenced(f"{rel(path)}:{start}", lang, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def _joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines with their backslash continuations joined, each under its first line's number."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in lines:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
        pending = (number, line.rstrip()[:-1]) if line.rstrip().endswith("\\") else None
        if pending is None:
            out.append((number, line))
    if pending is not None:
        out.append(pending)
    return out


def _command(where: str, text: str) -> Command | None:
    """The `cascade` command that `text` opens (None: it opens none), cut where the shell command ends."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unclosed quote in prose: not a command line
        return None
    while words and re.fullmatch(r"\w+=\S*|\$", words[0]):  # `VAR=value cascade ...`, a prompt's `$`
        words = words[1:]
    if not words or not (words[0] == "cascade" or words[0].endswith("/cascade")):
        return None
    rest = []
    for word in words[1:]:
        if word in COMMAND_END or word.startswith(">"):
            break
        rest.append(word)
    return Command(where, rest)


def commands(path: Path) -> list[Command]:
    """Every `cascade` command line `path` shows."""
    name, text = rel(path), path.read_text()
    found: list[Command] = []
    numbered = list(enumerate(text.splitlines(), 1))
    if path.suffix == ".md":
        for block in fenced_blocks(path):
            if block.lang in SHELL_FENCES:
                first = int(block.where.rsplit(":", 1)[1]) + 1
                lines = list(enumerate(block.text.splitlines(), first))
                found += [c for n, line in _joined(lines) if (c := _command(f"{name}:{n}", line))]
    else:
        comments = [(n, line.split("#", 1)[1]) for n, line in numbered if line.lstrip().startswith("#")]
        for n, comment in _joined(comments):
            opened = COMMENT_COMMAND.match(comment)
            if opened and "`" not in opened.group(1) and (c := _command(f"{name}:{n}", opened.group(1))):
                found.append(c)
        if path.suffix == ".sh":
            code = [(n, line) for n, line in numbered if not line.lstrip().startswith("#")]
            found += [c for n, line in _joined(code) if (c := _command(f"{name}:{n}", line))]
    for span in INLINE_COMMAND.finditer(text):
        if "\n\n" not in span.group(1):
            n = text.count("\n", 0, span.start()) + 1
            found += [c for c in [_command(f"{name}:{n}", span.group(1).replace("\n", " "))] if c]
    return found


def cited_paths(path: Path) -> list[tuple[str, str]]:
    """(where, repo-relative path) for each repo path `path` names, and each relative link it makes (resolved from
    its folder). A path with `*` is a glob."""
    name, folder = rel(path), path.parent
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        found += [(f"{name}:{n}", each) for cited in REPO_PATH.findall(line) for each in expanded(cited.rstrip("."))]
        if path.suffix == ".md":
            for target in LINK.findall(line):
                if "://" in target or target.startswith("mailto:"):
                    continue
                resolved = (folder / target).resolve()
                found.append((f"{name}:{n}", resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT)
                              else str(resolved)))
    return found


def expanded(path: str) -> list[str]:
    """`path` with its first `{a,b}` brace group expanded, and so on for the rest."""
    group = BRACES.search(path)
    if group is None:
        return [path]
    return [p for choice in group.group(1).split(",")
            for p in expanded(path[:group.start()] + choice + path[group.end():])]



def shown_routes() -> list[tuple[str, dict, str]]:
    """The `/v1/route` calls the docs show with an output: (where, the request body, the output as shown). The
    output is the `# {...}` comment lines after a `curl .../v1/route` (one output may span several), joined."""
    shown = []
    for doc in (p for p in doc_files() if p.suffix == ".md"):
        for block in fenced_blocks(doc):
            first = int(block.where.rsplit(":", 1)[1]) + 1
            lines = block.text.splitlines()
            for i, line in enumerate(lines):
                if "curl" not in line or "/v1/route" not in line:
                    continue
                end = i
                while lines[end].rstrip().endswith("\\"):
                    end += 1
                words = shlex.split(" ".join(part.rstrip().rstrip("\\") for part in lines[i:end + 1]))
                output: list[str] = []
                for following in lines[end + 1:]:
                    if not following.startswith("#") or (output and following.startswith("# {")):
                        break
                    if output or following.startswith("# {"):
                        output.append(following[1:].strip())
                if output:
                    shown.append((f"{rel(doc)}:{first + i}", json.loads(words[words.index("-d") + 1]),
                                  " ".join(output)))
    return shown


def cited_notes(path: Path) -> list[tuple[str, str]]:
    """(where, name) for each note `path` cites by its bare name (`FACTS.md`)."""
    return [(f"{rel(path)}:{n}", name) for n, line in enumerate(path.read_text().splitlines(), 1)
            for name in NOTE.findall(line)]
