"""The JSON Schema pieces the OpenAPI document's parts share (cascade/gateway/openapi.py, the chat and route
operations; cascade/gateway/openapi_responses.py, the Responses API's): references, what a quality hint may be, and
bounds added to msgspec's schemas."""

from __future__ import annotations

from typing import Any

from cascade.config import Limits
from cascade.router.policy import NAMED_HINTS
from cascade.schemas import LOGIT_BIAS, MAX_TOKEN_ID, MAX_TOP_K, PENALTY, SERVICE_TIER_CHARS, TOKEN_ID_DIGITS

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


def constrain_forwarded(request: dict[str, Any], limits: Limits) -> None:
    """The bounds on what a request sends on to an engine (cascade/service/validation.py `engine_bounds`), but the
    size of `tools` as JSON, which JSON Schema cannot say."""
    for name in ("presence_penalty", "frequency_penalty"):
        bound(request[name], minimum=-PENALTY, maximum=PENALTY)
    bound(request["min_p"], minimum=0, maximum=1)
    bound(request["repetition_penalty"], exclusiveMinimum=0, maximum=2)
    bound(request["top_k"], minimum=-1, maximum=MAX_TOP_K, **{"not": {"const": 0}})
    bound(request["top_logprobs"], minimum=0, maximum=limits.max_top_logprobs)
    bound(request["logit_bias"], maxProperties=limits.max_logit_bias,
          propertyNames={"pattern": f"^[0-9]{{1,{TOKEN_ID_DIGITS}}}$"},
          additionalProperties={"type": "number", "minimum": -LOGIT_BIAS, "maximum": LOGIT_BIAS})
    bound(request["tools"], maxItems=limits.max_tools)
    bound(request["metadata"], maxProperties=limits.max_metadata_pairs,
          propertyNames={"maxLength": limits.max_metadata_key_chars},
          additionalProperties={"type": "string", "maxLength": limits.max_metadata_value_chars})
    bound(request["user"], maxLength=limits.max_user_chars)
    bound(request["chat_template_kwargs"], maxProperties=limits.max_template_kwargs)
    bound(request["stop_token_ids"], maxItems=limits.max_stop_token_ids,
          items={"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID})
    bound(request["min_tokens"], minimum=0, maximum=limits.max_tokens)  # and at most the request's token limit
    bound(request["service_tier"], maxLength=SERVICE_TIER_CHARS)
