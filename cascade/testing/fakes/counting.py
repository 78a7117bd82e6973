"""An engine that counts tokens as a real one does: the prompt rendered with ChatML as Qwen2.5's template renders it
without tools (its default system prompt when the request has none; a developer message not rendered; a run of tool
results one user turn; a message's text parts joined with a space, as `transformers serve` joins them), written out
by hand here, and counted with a real tokenizer (`tokenizer.json`, the Rust `tokenizers` library), usage sent only in
the last chunk, as SGLang sends it. It answers `answer_tokens` tokens.

For the money tests and benchmarks: a reservation that underestimates a prompt shows here (spaced digits tokenize
at one token per byte), where the fixed-usage fake engine (engine.py) would hide it. `lie` makes it report a fixed
usage instead (negative, huge): an engine whose count must not reach a bill.

    app = CountingEngine(Path(".../qwen2.5-coder-0.5b/tokenizer.json"))
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec

from cascade.engines.asgi import Receive, Scope, Send, read_body, send_json

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def _text(content: str | list[dict[str, Any]] | None) -> str:
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content or ())


class CountingEngine:
    def __init__(self, tokenizer: Path, answer_tokens: int = 8, itl_ms: float = 0.0,
                 lie: tuple[int, int] | None = None) -> None:
        """`lie`: (prompt, completion) to report whatever was asked (None: the true counts)."""
        from tokenizers import Tokenizer  # transformers' dependency; only this fake needs it

        from cascade.engines.prompt_count import class_tokenizer

        # As the worker loads it: its transformers class may add a normalizer (Qwen2's NFC) tokenizer.json lacks.
        self.tokenizer = class_tokenizer(Tokenizer.from_file(str(tokenizer)), tokenizer.parent)
        self.answer_tokens = answer_tokens
        self.itl_ms = itl_ms
        self.lie = lie
        self.prompt_tokens: list[int] = []  # what it counted, per request, in arrival order

    def count(self, messages: list[dict[str, Any]]) -> int:
        """The prompt's tokens as the engine sees them: ChatML, the generation prompt included."""
        turns = [(m.get("role", ""), _text(m.get("content"))) for m in messages]
        if turns and turns[0][0] == "system":
            text, turns = f"<|im_start|>system\n{turns[0][1]}<|im_end|>\n", turns[1:]
        else:
            text = f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
        for i, (role, content) in enumerate(turns):
            if role == "tool":
                first, last = i == 0 or turns[i - 1][0] != "tool", i == len(turns) - 1 or turns[i + 1][0] != "tool"
                text += ("<|im_start|>user" if first else "") + f"\n<tool_response>\n{content}\n</tool_response>"
                text += "<|im_end|>\n" if last else ""
            elif role != "developer":
                text += f"<|im_start|>{role}\n{content}<|im_end|>\n"
        return len(self.tokenizer.encode(text + "<|im_start|>assistant\n", add_special_tokens=False).ids)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/v1/chat/completions":
            await send_json(send, 200, {"status": "ok"} if scope["path"] == "/health" else {"data": []})
            return
        body = msgspec.json.decode(await read_body(receive))
        prompt = self.count(body.get("messages") or [])
        self.prompt_tokens.append(prompt)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or self.answer_tokens
        tokens = min(self.answer_tokens, limit)
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens} if self.lie is None else {
            "prompt_tokens": self.lie[0], "completion_tokens": self.lie[1]}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        created = int(time.time())
        for i in range(tokens):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": created, "model": body.get("model"),
                     "choices": [{"index": 0, "delta": {"content": f" {i}"}, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": b"data: " + msgspec.json.encode(chunk) + b"\n\n",
                        "more_body": True})
            if self.itl_ms:
                await asyncio.sleep(self.itl_ms / 1000)
        last = {"id": "c", "object": "chat.completion.chunk", "created": created, "model": body.get("model"),
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length" if tokens == limit else "stop"}],
                "usage": usage}
        await send({"type": "http.response.body", "more_body": False,
                    "body": b"data: " + msgspec.json.encode(last) + b"\n\ndata: [DONE]\n\n"})
