"""`GET /docs`: a page for people, built from the OpenAPI document the gateway serves (so it names exactly the routes
that document does), linking that document at `/openapi.json`. Self-contained: no scripts, styles or fonts from
elsewhere (a gateway's network may reach nothing outside)."""

from __future__ import annotations

from html import escape
from typing import Any

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} {version}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}
td,th{{text-align:left;padding:.2em .8em .2em 0;vertical-align:top}}code{{white-space:nowrap}}</style></head>
<body><h1>{title} {version}</h1><p>{description}</p>
<p>The whole API, with every field and limit: <a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1).</p>
<table><tr><th>method</th><th>route</th><th>what</th></tr>
{rows}
</table></body></html>
"""


def docs_html(document: dict[str, Any]) -> bytes:
    """The page for the OpenAPI `document`: its title, and one row per route and method with its summary."""
    info = document["info"]
    rows = "\n".join(
        f"<tr><td>{escape(method.upper())}</td><td><code>{escape(path)}</code></td>"
        f"<td>{escape(operation.get('summary', ''))}</td></tr>"
        for path, operations in document["paths"].items() for method, operation in operations.items())
    return _PAGE.format(title=escape(info["title"]), version=escape(info["version"]),
                        description=escape(info.get("description", "")), rows=rows).encode()
