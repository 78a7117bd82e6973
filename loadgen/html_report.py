"""report.html: the run's report.md as one self-contained HTML file (plots embedded), to mail or attach.

It renders the Markdown this package writes (headings, lists, tables, images, `code`, **bold**, paragraphs),
not Markdown in general, so it needs no Markdown library; an image that is missing stays its alt text.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px}
td.num,th.num{text-align:right}th{background:#f4f4f4}img{max-width:100%}code{background:#f4f4f4;padding:0 3px}"""
# Module-level, so tests/test_linear_patterns.py checks them with every other pattern. No `[` in alt text and no
# `(` in a path: a scan for the closing bracket then stops at the next opening one (linear on `![![![...`).
_IMAGE = re.compile(r"!\[([^\[\]]*)\]\(([^()]+)\)")
_STRONG = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")
_HEADING = re.compile(r"(#{1,3}) (.*)")


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    out = _STRONG.sub(r"<strong>\1</strong>", out)
    return _CODE.sub(r"<code>\1</code>", out)


def _image(match: re.Match[str], folder: Path) -> str:
    alt, name = match.group(1), match.group(2)
    path = folder / name
    if not path.is_file():
        return html.escape(alt)
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(rows: list[str]) -> str:
    cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows]
    aligns = ["num" if c.endswith(":") else "" for c in cells[1]] if len(cells) > 1 else []
    head = "".join(f'<th class="{a}">{_inline(c)}</th>' for c, a in zip(cells[0], aligns, strict=False))
    body = "".join("<tr>" + "".join(f'<td class="{a}">{_inline(c)}</td>' for c, a in zip(r, aligns, strict=False))
                   + "</tr>" for r in cells[2:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def to_html(markdown: str, folder: Path, title: str = "Load test report") -> str:
    """`markdown` (as report.md holds it) as an HTML page, images from `folder` embedded."""
    parts: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            parts.append(_table(block))
            continue
        if line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            parts.append("<ul>" + "".join(items) + "</ul>")
            continue
        if heading := _HEADING.match(line):
            level = len(heading.group(1))
            parts.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif _IMAGE.fullmatch(line.strip()):
            parts.append("<p>" + _IMAGE.sub(lambda m: _image(m, folder), line.strip()) + "</p>")
        elif line.strip():
            parts.append(f"<p>{_inline(line)}</p>")
        i += 1
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
