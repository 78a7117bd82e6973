"""`cascade scorer-server`: an embedded model as a step scorer, behind SGLang's PRM wire format.

It answers what cascade's PRM client (cascade/branches/prm_client.py) sends an SGLang PRM, so a tier scores
with it exactly as with a GPU PRM:

- `POST /classify` (and `/encode`, the same handler, as in SGLang): `{"text": <str or list of str>, ...}`,
  each text a Qwen2.5-Math-PRM input (`prm_input`). The question and steps are read back out of it and
  judged by the verifier (cascade/branches/verifier.py): one prefill, P(yes) / (P(yes) + P(no)).
  Answer: `{"embedding": [score], "meta_info": {...}}` per input, a list of them for a list, in input
  order. `meta_info` has `prompt_tokens`, `cached_tokens` (reused from the prefix cache) and
  `e2e_latency` (seconds of the forward pass).
- A body that is not such a request, or a text that is not a PRM input or is too long for the model:
  400 with `{"error": {"message", "type", "param", "code"}}` (SGLang's shape, as the client reads it).
- `GET /health`: 200 once the model is loaded (it is loaded and warmed before the port opens);
  `GET /get_model_info`: `{"model_path", "is_generation": false}`.

Scoring runs on one thread (torch's own threads: `--threads`), one request after another; the event loop
stays free for /health. Started by the embedded supervisor for a `[[workers]]` entry with `role =
"scorer"` (`scorer_command`), or by hand. No torch at import time: `scorer_command` is used by the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import msgspec

from cascade.branches.verifier import Prompt, Scored, parse_prm_input
from cascade.engines.asgi import Receive, Scope, Send, read_body, send_json

log = logging.getLogger("cascade.engines.scorer")
MAX_BODY_BYTES = 16 << 20


class Verifier(Protocol):
    """What the server needs of a model (cascade.engines.verifier_model.VerifierModel)."""

    def encode(self, question: str, steps: list[str]) -> list[int]: ...

    def score_ids(self, inputs: list[list[int]]) -> list[Scored]: ...


class ClassifyRequest(msgspec.Struct):
    """SGLang's EmbeddingReqInput, the fields this server reads (others are ignored, as SGLang ignores
    `model`)."""

    text: str | list[str]
    model: str = ""


_decode_request = msgspec.json.Decoder(ClassifyRequest).decode


def _error(message: str, status: int = 400) -> dict[str, Any]:
    kind = "BadRequestError" if status == 400 else "NotFoundError" if status == 404 else "Error"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class ScorerApp:
    """The ASGI app around a loaded model. `model_path` is reported by /get_model_info."""

    def __init__(self, model: Verifier, model_path: str = "") -> None:
        self.model = model
        self.model_path = model_path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scorer")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if path in ("/classify", "/encode"):
            if method not in ("POST", "PUT"):
                await send_json(send, 405, _error(f"{path} takes POST", 405))
                return
            status, payload = await self.classify(await read_body(receive))
            await send_json(send, status, payload)
        elif path == "/health" and method == "GET":
            await send_json(send, 200, {})
        elif path == "/get_model_info" and method == "GET":
            await send_json(send, 200, {"model_path": self.model_path, "is_generation": False})
        else:
            await send_json(send, 404, _error(f"no route {method} {path}", 404))

    async def classify(self, body: bytes) -> tuple[int, Any]:
        if len(body) > MAX_BODY_BYTES:
            return 413, _error(f"body over {MAX_BODY_BYTES} bytes", 413)
        try:
            request = _decode_request(body)
        except msgspec.DecodeError as exc:
            return 400, _error(f"expected a JSON object with `text` (a string or a list of strings): {exc}")
        texts = [request.text] if isinstance(request.text, str) else request.text
        if not texts:
            return 400, _error("`text` is an empty list")
        try:
            inputs = [self.model.encode(*parse_prm_input(text)) for text in texts]
        except ValueError as exc:
            return 400, _error(str(exc))
        loop = asyncio.get_running_loop()
        scored = await loop.run_in_executor(self._executor, self.model.score_ids, inputs)
        outputs = [{"embedding": [s.score], "meta_info": {
            "id": uuid.uuid4().hex, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
            "e2e_latency": round(s.seconds, 6)}} for s in scored]
        return 200, outputs[0] if isinstance(request.text, str) else outputs

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def resolve_model(name_or_dir: str) -> Path:
    """An embedded model's name (prepared into the cache if needed) or a model directory."""
    path = Path(name_or_dir)
    if path.is_dir():
        return path
    from cascade.engines.models import load_card, prepare

    return prepare(load_card(name_or_dir))


def load_verifier(model_dir: Path, *, dtype: str = "bfloat16", threads: int = 1, prefix_cache_tokens: int = 16384,
                  max_batch: int = 8, prompt: Prompt = "judge") -> Any:
    """The model, loaded and warmed up (one short scoring pass: the first forward pass sets up the kernels)."""
    from cascade.engines.verifier_model import VerifierModel

    model = VerifierModel(model_dir, dtype=dtype, threads=threads, prefix_cache_tokens=prefix_cache_tokens,
                          max_batch=max_batch, prompt=prompt)
    model.score([("What is 1 + 1?", ["1 + 1 = 2."])])
    return model


def serve(model: str, host: str, port: int, *, dtype: str = "bfloat16", threads: int = 1,
          prefix_cache_tokens: int = 16384, max_batch: int = 8, prompt: Prompt = "judge") -> None:
    """Load the model and serve it until interrupted (`cascade scorer-server`)."""
    import uvicorn
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars in the worker's log
    model_dir = resolve_model(model)
    t0 = time.perf_counter()
    verifier = load_verifier(model_dir, dtype=dtype, threads=threads, prefix_cache_tokens=prefix_cache_tokens,
                             max_batch=max_batch, prompt=prompt)
    print(f"scorer-server: {model_dir} loaded in {time.perf_counter() - t0:.1f} s ({dtype}, {threads} thread(s), "
          f"prompt {prompt}); "
          f"serving on http://{host}:{port}", file=sys.stderr, flush=True)
    app = ScorerApp(verifier, str(model_dir))
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        app.close()


def scorer_command(model_dir: Path, port: int, threads: int = 1) -> list[str]:
    """The command line of a scorer worker (the supervisor runs it on 127.0.0.1)."""
    return [sys.executable, "-m", "cascade.cli", "scorer-server", "--model", str(model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--threads", str(threads)]
