"""Decoding a chat completion request body: bounded work per byte, a 400 naming what is wrong, never a traceback.

    req = decode_chat_request(raw, max_depth=limits.max_json_depth)

* **Nesting.** msgspec recurses per level and raises RecursionError near Python's recursion limit (a tool schema
  3,000 levels deep was a 500 with a traceback). The body's depth is checked before decoding: skipped when it has no
  more `[`/`{` than the limit (almost every body), else measured on its brackets outside strings (a regex that
  consumes each string once, then numpy over what is left), linear in the body's length whatever it holds.
* **Whole floats.** OpenAI accepts `"n": 2.0` where an integer is meant. The typed decode refuses it; the path in
  msgspec's error then names the field, that one value is made an int and the decoded body converted again (C
  work, at most `MAX_WHOLE_FLOATS` times, on top-level and `branches` fields, and a list of ints such as
  `stop_token_ids` mended whole in one pass): no Python walk over the body.
* **Reasoning in the history.** An assistant turn may carry its reasoning as `reasoning_content` (SGLang's name) or
  `reasoning` (vLLM's since 2026); it is kept as `reasoning_content` (the first, where a turn has both), and each tier
  sends it under the name its engines read (cascade/tiers/thinking.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import numpy as np

from cascade.errors import InvalidRequest
from cascade.schemas import ChatCompletionRequest

T = TypeVar("T")
_decode_request = msgspec.json.Decoder(ChatCompletionRequest).decode
_decode_any = msgspec.json.Decoder().decode

# One JSON string, from its quote to its closing quote or to the end of the body (an unterminated one): possessive,
# so a match never fails once started and the search never rescans a string (`"\"\"\"...` stays linear).
_JSON_STRING = re.compile(rb'(?s)"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = np.frombuffer(b"[{", dtype=np.uint8)
# The int fields OpenAI also accepts as whole floats: the request's own and its `branches` override's.
MAX_WHOLE_FLOATS = 12
_WHOLE_FLOAT_PATH = re.compile(r"(?:branches\.)?[a-z_]{1,32}")
# ... and an entry of a list of ints (`stop_token_ids[3]`): the whole list is mended at once, so a long list costs
# one pass, not one decode per entry.
_WHOLE_FLOAT_ENTRY = re.compile(r"(?P<field>[a-z_]{1,32})\[[0-9]{1,9}\]")


def json_depth(raw: bytes) -> int:
    """How deep the arrays and objects of `raw` nest (0 for a scalar), brackets inside strings not counted."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS), dtype=np.uint8)
    if not len(skeleton):
        return 0
    steps = np.where(np.isin(skeleton, _OPENERS), 1, -1)
    return max(0, int(np.cumsum(steps).max()))


def check_depth(raw: bytes, max_depth: int) -> None:
    """InvalidRequest when `raw` nests deeper than `max_depth`."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return  # cannot nest deeper than it has brackets
    depth = json_depth(raw)
    if depth > max_depth:
        raise InvalidRequest(f"request body nests {depth} levels deep; the limit is {max_depth} "
                             "([gateway.limits] max_json_depth)", None, "nesting_too_deep")


def decode_chat_request(raw: bytes, *, max_depth: int = 64) -> ChatCompletionRequest:
    return _one_reasoning_name(decode_body(raw, _decode_request, "a JSON chat completion request",
                                           max_depth=max_depth, mend=_chat_whole_floats))


def decode_body(raw: bytes, decode: Callable[[bytes], T], what: str, *, max_depth: int,
                mend: Callable[[bytes, str], T | str] | None = None) -> T:
    """`raw` decoded strictly by `decode` (a typed msgspec decoder), after the depth check; every failure an
    InvalidRequest naming the field. `what`: what the body should be, for an empty one. `mend`: given the body and
    msgspec's error, the body decoded another way, or the error to report."""
    if not raw.strip():
        raise InvalidRequest(f"request body is empty; send {what}", None, "invalid_json")
    check_depth(raw, max_depth)
    try:
        return decode(raw)
    except msgspec.ValidationError as exc:
        error = str(exc)
        if mend is not None:
            mended = mend(raw, error)
            if not isinstance(mended, str):
                return mended
            error = mended
        message, param = validation_param(error)
        raise InvalidRequest(message, param, "invalid_type") from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start} of a JSON string)", None,
                             "invalid_json") from None
    except RecursionError:  # cannot happen under check_depth's limit; never a traceback if it does
        raise InvalidRequest("request body nests too deep to decode", None, "nesting_too_deep") from None


def whole_floats(kind: type[T]) -> Callable[[bytes, str], T | str]:
    """A `decode_body` mend for requests of `kind`: OpenAI accepts `"n": 2.0` where an int is meant; only a body
    whose error is at such a field pays for a second decode."""

    def mend(raw: bytes, error: str) -> T | str:
        if _whole_float_path(error) is None:
            return error
        whole = _with_whole_floats(raw, kind)
        return error if whole is None else whole

    return mend


_chat_whole_floats = whole_floats(ChatCompletionRequest)


def _one_reasoning_name(req: ChatCompletionRequest) -> ChatCompletionRequest:
    """`req` with each turn's reasoning as `reasoning_content` (module docstring)."""
    if all(m.reasoning is None for m in req.messages):
        return req
    messages = [m if m.reasoning is None else msgspec.structs.replace(
        m, reasoning_content=m.reasoning if m.reasoning_content is None else m.reasoning_content, reasoning=None)
        for m in req.messages]
    return msgspec.structs.replace(req, messages=messages)


def _whole_float_path(message: str) -> list[str] | None:
    """The field path of msgspec's "Expected `int...`, got `float` - at `$.a.b`", when it is one OpenAI would
    accept a whole float for (a top-level or `branches` field), else None."""
    if not (message.startswith("Expected `int") and "got `float`" in message):  # `int` or `int | null`
        return None
    _, _, where = message.partition(" - at `$.")
    path = where.rstrip("`")
    if entry := _WHOLE_FLOAT_ENTRY.fullmatch(path):
        return [entry["field"], "[]"]
    return path.split(".") if _WHOLE_FLOAT_PATH.fullmatch(path) else None


def _with_whole_floats(raw: bytes, kind: type[T]) -> T | str | None:
    """The request with its whole-float int fields read as ints; else the error that is left once they are (a
    fraction where an int is meant, another field's), or None to report the typed decode's own."""
    try:
        body: Any = _decode_any(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError):
        return None
    for _ in range(MAX_WHOLE_FLOATS):
        try:
            return msgspec.convert(body, kind)
        except msgspec.ValidationError as exc:
            path = _whole_float_path(str(exc))
            if path is not None and path[-1] == "[]":  # a list of ints: every whole float in it, in one pass
                values = body.get(path[0]) if isinstance(body, dict) else None
                if not isinstance(values, list):
                    return str(exc)
                if not any(isinstance(v, float) and v.is_integer() for v in values):
                    return str(exc)  # nothing to mend: a fraction or another type is what is wrong
                body[path[0]] = [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]
                continue
            *parents, name = path or [""]
            holder = body
            for key in parents:
                holder = holder.get(key) if isinstance(holder, dict) else None
            value = holder.get(name) if isinstance(holder, dict) else None
            if path is None or not (isinstance(value, float) and value.is_integer()):
                return str(exc)
            assert isinstance(holder, dict)
            holder[name] = int(value)
    return None


def validation_param(message: str) -> tuple[str, str | None]:
    """msgspec: 'Expected `int`, got `str` - at `$.n`' -> ('... at `n`', 'n'). A client's key in it is cut to
    `SHOWN_KEY_CHARS` (a key may be a megabyte)."""
    text, _, where = message.partition(" - at `$")
    path = _cut(where.rstrip("`").lstrip(".")) or None
    if text.startswith("Object contains unknown field"):
        field = _cut(text.split("`")[1])
        path = f"{path}.{field}" if path else field
        return f"unrecognized request argument supplied: `{path}`", path
    if text.startswith("Object missing required field"):
        field = text.split("`")[1]
        path = f"{path}.{field}" if path else field
        return f"missing required parameter: `{path}`", path
    return (f"invalid value for `{path}`: {text}" if path else text), path


SHOWN_KEY_CHARS = 64


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_KEY_CHARS else f"{text[:SHOWN_KEY_CHARS]}..."
