"""The JSON the fake SGLang server (sglang.py) sends: SGLang's OpenAI chat route's own shapes, read from
its source at the release pinned in tests/fixtures/sglang/sglang-pin.txt (`srt/entrypoints/openai/`:
`serving_chat.py`, `protocol.py`, `sse_utils.py`, `usage_processor.py`). tests/contract/ checks every shape
against that release's pydantic models and serializers.

SGLang writes a stream with two serializers, and the fake copies both:
- text chunks (role, reasoning, content, logprobs-only, finish) with msgspec (`sse_utils.build_sse_content`):
  the delta always has `reasoning_content` (null or text) and only the other fields that are set, and the
  chunk has no `usage` key;
- tool-call chunks and the usage chunk with pydantic (`model_dump_json`): every delta field is there (`role`,
  `content`, `reasoning_content` null) and the chunk ends with `"usage": null` or the usage.
A whole completion is pydantic's dump: a message without tool calls has no `tool_calls` key (never null).

Generated tokens are planned as (kind, text) steps: "reasoning_content", "content", or, for a tool call,
"tool_name" (the step that names the function) then "tool_arguments" (the argument text, piece by piece).
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

EOS_TOKEN_ID = 151645  # reported as `matched_stop` when a generation ends on its own
PROMPT_TOKENS = 8

Step = tuple[str, str]  # (kind, text) of one generated token


def tool_to_call(body: dict[str, Any]) -> str | None:
    """The function the fake calls for this request: with `tools` and a `tool_choice` other than "none", the
    function `tool_choice` names, else the first tool (SGLang parses calls only when it runs with
    `--tool-call-parser`; the fake behaves as if it did, and its model always calls a tool it may call)."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice") or "auto"
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or "")
    return str((tools[0].get("function") or {}).get("name") or "")


def tool_steps(name: str, answer: str) -> list[Step]:
    """A call of `name` whose arguments are the scripted answer when it is a JSON object (e.g.
    ``[fake answer={"city":_"Paris"}]``), else ``{"text": answer}``: one step for the name, then one per word."""
    try:
        arguments = answer if isinstance(json.loads(answer), dict) else ""
    except ValueError:
        arguments = ""
    arguments = arguments or json.dumps({"text": answer})
    words = arguments.split(" ")
    return [("tool_name", name)] + [("tool_arguments", w if i == 0 else " " + w) for i, w in enumerate(words)]


def chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None,
          logprobs: dict[str, Any] | None = None, matched_stop: int | None = None) -> dict[str, Any]:
    """A text chunk (msgspec's `StreamChunk`): `delta` must hold `reasoning_content`."""
    return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                                 "matched_stop": matched_stop}]}


def step_chunks(head: dict[str, Any], kind: str, text: str, call_id: str,
                logprobs: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The chunks of one generated token. Logprobs ride on a text chunk; after a tool-call chunk SGLang flushes
    them in a chunk of their own (`_generate_stream_content`)."""
    if kind == "reasoning_content":
        return [chunk(head, {"reasoning_content": text}, logprobs=logprobs)]
    if kind == "content":
        return [chunk(head, {"reasoning_content": None, "content": text}, logprobs=logprobs)]
    named = kind == "tool_name"
    call = {"id": call_id if named else None, "index": 0, "type": "function",
            "function": {"name": text if named else None, "arguments": "" if named else text}}
    delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": [call]}
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                                    "matched_stop": None}], "usage": None}]
    if logprobs is not None:
        chunks.append(chunk(head, {"reasoning_content": None}, logprobs=logprobs))
    return chunks


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"  # SGLang's id for every tool-call parser but Kimi's


def finish_reason(steps: list[Step], finish: str) -> str:
    """SGLang reports a generation that stopped on its own after a tool call as "tool_calls"."""
    return "tool_calls" if finish == "stop" and any(k == "tool_name" for k, _ in steps) else finish


def logprob_entry(text: str, logprob: float, top: int) -> dict[str, Any]:
    """One `ChatCompletionTokenLogprob`. Its `top` alternatives hold the token itself and made-up tokens
    sharing the rest of the probability mass, most likely first."""
    alternatives = [(text, logprob)]
    rest = -math.expm1(logprob)  # 1 - p(token)
    alternatives += [(f"<alt{j}>", math.log(rest / 2 ** j) if rest > 0 else -math.inf) for j in range(1, top)]
    alternatives.sort(key=lambda a: -a[1])
    top_logprobs = [{"token": t, "bytes": list(t.encode()), "logprob": max(lp, -9999.0)} for t, lp in alternatives]
    return {"token": text, "bytes": list(text.encode()), "logprob": logprob, "top_logprobs": top_logprobs[:top]}


def top_logprobs(body: dict[str, Any]) -> int | None:
    """How many alternatives per token the request asked for; None: it asked for no logprobs."""
    return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None


def usage(steps: list[Step], prompt_tokens: int = PROMPT_TOKENS) -> dict[str, Any]:
    """`UsageProcessor.calculate_token_usage` without `--enable-cache-report`."""
    reasoning = sum(1 for kind, _ in steps if kind == "reasoning_content")
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(steps), "completion_tokens": len(steps),
            "prompt_tokens_details": None, "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None}


def usage_chunk(head: dict[str, Any], steps: list[Step], prompt_tokens: int = PROMPT_TOKENS) -> dict[str, Any]:
    return {**head, "choices": [], "usage": usage(steps, prompt_tokens)}


def completion(head: dict[str, Any], steps: list[Step], finish: str, call_id: str, logprob: float,
               top: int | None, prompt_tokens: int = PROMPT_TOKENS) -> dict[str, Any]:
    """A whole `ChatCompletionResponse` (not streamed) for the generated `steps`."""
    message: dict[str, Any] = {
        "role": "assistant", "content": "".join(t for k, t in steps if k == "content"),
        "reasoning_content": "".join(t for k, t in steps if k == "reasoning_content") or None,
    }
    names = [t for k, t in steps if k == "tool_name"]
    if names:
        arguments = "".join(t for k, t in steps if k == "tool_arguments")
        message["tool_calls"] = [{"id": call_id, "index": 0, "type": "function",
                                  "function": {"name": names[0], "arguments": arguments}}]
    reason = finish_reason(steps, finish)
    choice = {"index": 0, "message": message,
              "logprobs": None if top is None else {"content": [logprob_entry(t, logprob, top) for _, t in steps]},
              # A stop turned into "tool_calls" loses its matched stop (`_process_tool_calls`).
              "finish_reason": reason, "matched_stop": EOS_TOKEN_ID if reason == "stop" else None}
    return {**head, "object": "chat.completion", "choices": [choice], "usage": usage(steps, prompt_tokens),
            "metadata": {"weight_version": "default"}}
