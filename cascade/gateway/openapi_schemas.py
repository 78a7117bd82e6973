"""The JSON Schema pieces the OpenAPI document's parts share (cascade/gateway/openapi.py, the chat and route
operations; cascade/gateway/openapi_responses.py, the Responses API's): references, what a quality hint may be, and
bounds added to msgspec's schemas."""

from __future__ import annotations

from typing import Any

from cascade.router.policy import NAMED_HINTS

REF = "#/components/schemas/{name}"
# A numeric quality hint sent as text (the header always is): a number in (0, 1].
NUMERIC_HINT = r"^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$"


def hint_text() -> dict[str, Any]:
    # An empty hint is no hint. The gateway also accepts other spellings (case, whitespace) of these.
    return {"type": "string", "anyOf": [{"enum": ["", *NAMED_HINTS]}, {"pattern": NUMERIC_HINT}]}


def quality_schema() -> dict[str, Any]:
    """The body's `quality` (chat completions and responses alike)."""
    return {"anyOf": [hint_text(), {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}],
            "default": None, "description": "A named operating point or an accuracy target in (0, 1]."}


def bound(prop: dict[str, Any], **keywords: Any) -> None:
    """Add `keywords` to the non-null alternative(s) of `prop` (msgspec writes `X | None` as anyOf)."""
    kind = "array" if "maxItems" in keywords or "minItems" in keywords else None
    for alternative in prop.get("anyOf", [prop]):
        if alternative.get("type") == "null":
            continue
        if kind is None or alternative.get("type") == kind:
            alternative.update(keywords)
