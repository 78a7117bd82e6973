"""A fake continuously-batching engine with known step costs, for testing `cascade profile`'s fits.

FakeEngine's latencies do not depend on prompt length or concurrency; this one does, as a real
engine's: one loop alternates a prefill of every waiting prompt (`prefill_fixed_s +
prefill_per_token_s * tokens`, which yields their first token) and decode steps of the running batch
(`step_fixed_s + step_per_sequence_s * B`, one token each). A prompt's tokens are its words.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Sequence:
    prompt_tokens: int
    max_tokens: int
    sent: int = 0
    tokens: asyncio.Queue[bool] = field(default_factory=asyncio.Queue)  # True: one token; False: done

    def emit(self) -> bool:
        """Produce one token; True when the sequence is finished."""
        self.sent += 1
        self.tokens.put_nowait(True)
        if self.sent >= self.max_tokens:
            self.tokens.put_nowait(False)
            return True
        return False


class BatchingEngine:
    def __init__(self, prefill_fixed_s: float, prefill_per_token_s: float, step_fixed_s: float,
                 step_per_sequence_s: float) -> None:
        self.prefill_fixed_s, self.prefill_per_token_s = prefill_fixed_s, prefill_per_token_s
        self.step_fixed_s, self.step_per_sequence_s = step_fixed_s, step_per_sequence_s
        self.waiting: list[_Sequence] = []
        self.running: list[_Sequence] = []
        self._loop: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        """Runs while there is work; the next request starts it again."""
        while self.waiting or self.running:
            if self.waiting:
                batch, self.waiting = self.waiting, []
                await asyncio.sleep(self.prefill_fixed_s + self.prefill_per_token_s * sum(s.prompt_tokens for s in batch))
                self.running += [s for s in batch if not s.emit()]
                continue
            await asyncio.sleep(self.step_fixed_s + self.step_per_sequence_s * len(self.running))
            self.running = [s for s in self.running if not s.emit()]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": "batching-fake", "object": "model"}]})
            return
        if scope["path"] != "/v1/chat/completions":
            await _json(send, 404, {"error": {"message": "not found"}})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        sequence = _Sequence(len(request["messages"][-1]["content"].split()), int(request["max_tokens"]))
        self.waiting.append(sequence)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_running_loop().create_task(self._run())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        while await sequence.tokens.get():
            chunk = {"choices": [{"index": 0, "delta": {"content": f"t{sequence.sent} "}, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True})
        usage = {"prompt_tokens": sequence.prompt_tokens, "completion_tokens": sequence.max_tokens}
        tail = f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": tail.encode(), "more_body": False})


async def _json(send: Any, status: int, payload: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})
