"""A request's path as both front doors route on it: the gateway (cascade/gateway/chat_asgi.py, for every route)
and the Envoy model picker (cascade/extproc/picker.py, for the chat path) normalise it with this one function, so that
no spelling of the chat path is served by the gateway without the picker deciding it, or the other way round.

Normalised (`normalize_path`), in this order:

1. percent-encoded unreserved characters decoded (RFC 3986 6.2.2.2: letters, digits, `-._~`): `/v1/chat/%63ompletions`
   is `/v1/chat/completions`;
2. runs of slashes merged: `//v1//models` is `/v1/models` (Envoy's `merge_slashes`, nginx's default);
3. dot segments removed (RFC 3986 5.2.4), encoded dots included: `/v1/x/../models` and `/v1/%2e/models` are
   `/v1/models`;
4. the other escapes decoded, as ASGI's `path` is (`%20` a space): none of them can be a character of a route.

A trailing slash stays (`/v1/models/` is another path, a 404, as it is to Envoy), and so does case. A path with an
encoded slash or backslash (`%2F`, `%5C`) has no normal form (None: the gateway answers 400): decoded, it would turn
data into a separator, and left encoded, it names no route. But for one route, whose tail is data: `GET
/v1/models/{id}`, where OpenAI's SDK percent-encodes a model id whole (`Qwen/Qwen3-8B` is `Qwen%2FQwen3-8B`). A path
that starts with `MODEL_PATH` as sent and has an encoded separator is that prefix and its tail decoded as it is: it
names a model or none, never another route. The Envoy documents (cascade/deploy/envoy.py) ask Envoy for
the same (`normalize_path`, `merge_slashes`, escaped slashes kept for the gateway to refuse).
"""

from __future__ import annotations

import re
import string
from urllib.parse import unquote

_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
_SLASHES = re.compile(r"//+")
MODEL_PATH = "/v1/models/"


def normalize_path(path: str) -> str | None:
    """`path` (a request target's path, without its query) in normal form, or None where it has none."""
    if "%" not in path and "//" not in path and "/." not in path:
        return path  # already normal: nearly every request
    if _ENCODED_SEPARATOR.search(path):
        return MODEL_PATH + unquote(path[len(MODEL_PATH):]) if path.startswith(MODEL_PATH) else None
    path = _ESCAPE.sub(_unreserved, path)
    path = _remove_dot_segments(_SLASHES.sub("/", path))
    return unquote(path) if "%" in path else path


def _unreserved(escape: re.Match[str]) -> str:
    char = chr(int(escape[1], 16))
    return char if char in _UNRESERVED else escape[0]


def _remove_dot_segments(path: str) -> str:
    if not path.startswith("/"):
        return path  # `*` (OPTIONS), or no path: nothing to resolve
    segments = path.split("/")[1:]
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    trailing = "/" if segments[-1] in (".", "..") and kept else ""
    return "/" + "/".join(kept) + trailing
