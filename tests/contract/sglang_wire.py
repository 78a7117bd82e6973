"""What SGLang accepts and sends on its chat route, decided by SGLang's own code (tests/contract/sglang_protocol.py).

- `unknown_fields(body, request)`: the fields of a request body SGLang's `ChatCompletionRequest` does not declare.
  Its models ignore unknown fields (pydantic's default), so a field SGLang does not know would be dropped
  without a word: validating alone cannot tell.
- `sglang_event(chunk)` / `sglang_completion(body)`: the bytes SGLang itself writes for the same content. SGLang
  serializes a stream's text chunks with msgspec (`sse_utils.build_sse_content`) and its tool-call and usage
  chunks, and whole completions, with pydantic (`model_dump_json`): a chunk is in SGLang's shape when it equals
  one of these after validation.

`python -m tests.contract.sglang_wire` rewrites the response fixtures of tests/fixtures/sglang/ as the pinned
SGLang serializes them (values kept); `--check` only says which differ. `make sglang-contract SGLANG=X.Y.Z` bumps
the pin, installs it, rewrites the fixtures and runs the contract tests.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pydantic

from tests.contract.sglang_protocol import SGLangProtocol, load

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sglang"
# Request bodies recorded (researched) in tests/fixtures/sglang/, and the responses rewritten by the pinned SGLang.
REQUEST_FIXTURES = ("chat_completion_request.json", "chat_completion_stream_request.json")
COMPLETION_FIXTURES = ("chat_completion_response.json",)
STREAM_FIXTURES = ("chat_completion_stream.txt", "chat_completion_stream_error.txt")
ERROR_FIXTURES = ("chat_completion_error_400.json",)


def validate_request(sglang: SGLangProtocol, body: dict[str, Any]) -> Any:
    """`body` as SGLang's `ChatCompletionRequest` (raises pydantic's ValidationError), after checking that
    SGLang declares every field in it, nested ones included."""
    # A copy: SGLang's before-validators edit what they are given (`set_json_schema` pops `schema`).
    request = sglang.protocol.ChatCompletionRequest.model_validate(copy.deepcopy(body))
    if unknown := unknown_fields(body, request):
        raise AssertionError(f"SGLang {sglang.version} would silently drop {', '.join(unknown)}")
    return request


def unknown_fields(data: Any, value: Any, path: str = "") -> list[str]:
    """Keys of the JSON `data` that the pydantic model `value` (validated from it) has no field for."""
    if isinstance(value, pydantic.BaseModel) and isinstance(data, dict):
        fields = type(value).model_fields
        known = {name: name for name in fields} | {f.alias: name for name, f in fields.items() if f.alias}
        found = []
        for key, item in data.items():
            if key not in known:
                found.append(f"`{path}{key}`")
            else:
                # Read through __dict__: a deprecated field (`max_tokens`) warns when read as an attribute.
                found += unknown_fields(item, value.__dict__[known[key]], f"{path}{key}.")
        return found
    if isinstance(data, list) and isinstance(value, list) and len(data) == len(value):
        return [p for i, (d, v) in enumerate(zip(data, value, strict=True))
                for p in unknown_fields(d, v, f"{path}{i}.")]
    return []


def sglang_usage(sglang: SGLangProtocol, usage: dict[str, Any]) -> dict[str, Any]:
    """The `usage` SGLang reports for the token counts in `usage` (`UsageProcessor`: e.g. the total, and
    `completion_tokens_details` exactly when there are reasoning tokens)."""
    counts = sglang.protocol.UsageInfo.model_validate(usage)
    filled = sglang.usage_processor.UsageProcessor.calculate_token_usage(
        prompt_tokens=counts.prompt_tokens, completion_tokens=counts.completion_tokens,
        reasoning_tokens=counts.reasoning_tokens, cached_tokens=counts.prompt_tokens_details)
    return dict(filled.model_dump())


def sglang_completion(sglang: SGLangProtocol, body: dict[str, Any]) -> bytes:
    """A whole completion as SGLang writes it (`model_json_response`: `model_dump_json(by_alias=True)`)."""
    body = {**body, "usage": sglang_usage(sglang, body["usage"])} if "usage" in body else body
    return sglang.protocol.ChatCompletionResponse.model_validate(body).model_dump_json(by_alias=True).encode()


def sglang_event(sglang: SGLangProtocol, chunk: dict[str, Any]) -> bytes:
    """One `data:` event of a stream as SGLang writes it: an in-band error (`{"error": {...}}`, json.dumps of an
    `ErrorResponse`), a tool-call or usage chunk (pydantic), or a text chunk (msgspec)."""
    if set(chunk) == {"error"}:
        error = sglang.protocol.ErrorResponse.model_validate(chunk["error"])
        return f"data: {json.dumps({'error': error.model_dump()})}\n\n".encode()
    if chunk.get("usage") is not None:
        chunk = {**chunk, "usage": sglang_usage(sglang, chunk["usage"])}
    parsed = sglang.protocol.ChatCompletionStreamResponse.model_validate(chunk)
    if len(parsed.choices) != 1 or parsed.choices[0].delta.tool_calls is not None:
        return f"data: {parsed.model_dump_json()}\n\n".encode()
    choice = parsed.choices[0]
    event: str = sglang.sse_utils.build_sse_content(
        chunk_id=parsed.id, created=parsed.created, model=parsed.model, index=choice.index,
        role=choice.delta.role, content=choice.delta.content, reasoning_content=choice.delta.reasoning_content,
        finish_reason=choice.finish_reason, matched_stop=choice.matched_stop,
        logprobs=None if choice.logprobs is None else choice.logprobs.model_dump(),
        usage=None if parsed.usage is None else parsed.usage.model_dump(),
    )
    return event.encode()


def sse_events(body: bytes) -> list[bytes]:
    """The `data:` payloads of an SSE body, `[DONE]` included."""
    return [line[6:] for line in body.split(b"\n\n") if line.startswith(b"data: ")]


def sglang_stream(sglang: SGLangProtocol, body: bytes) -> bytes:
    """A whole SSE body as SGLang writes it: each event re-serialized, then `data: [DONE]`."""
    events = sse_events(body)
    chunks = [sglang_event(sglang, json.loads(e)) for e in events if e != b"[DONE]"]
    return b"".join(chunks) + (b"data: [DONE]\n\n" if events and events[-1] == b"[DONE]" else b"")


def sglang_error(sglang: SGLangProtocol, body: dict[str, Any]) -> bytes:
    """An error body as SGLang writes it (`ORJSONResponse(ErrorResponse.model_dump())`: compact JSON)."""
    error = sglang.protocol.ErrorResponse.model_validate(body).model_dump()
    return json.dumps(error, separators=(",", ":")).encode()


def canonical_fixtures(sglang: SGLangProtocol) -> dict[str, bytes]:
    """Each response fixture as the pinned SGLang writes it."""
    out = {}
    for name in COMPLETION_FIXTURES:
        out[name] = sglang_completion(sglang, json.loads((FIXTURES / name).read_bytes())) + b"\n"
    for name in STREAM_FIXTURES:
        out[name] = sglang_stream(sglang, (FIXTURES / name).read_bytes())
    for name in ERROR_FIXTURES:
        out[name] = sglang_error(sglang, json.loads((FIXTURES / name).read_bytes())) + b"\n"
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    sglang = load()
    stale = []
    for name, content in canonical_fixtures(sglang).items():
        path = FIXTURES / name
        if path.read_bytes() != content:
            stale.append(name)
            if not check:
                path.write_bytes(content)
    for name in REQUEST_FIXTURES:
        validate_request(sglang, json.loads((FIXTURES / name).read_bytes()))
    verb = "differ from" if check else "rewritten as"
    print(f"{len(stale)} fixture(s) {verb} sglang {sglang.version}: {', '.join(stale) or 'none'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
