"""What the ext_proc tests share: a three-tier config Envoy can reach (host names, a path prefix, TLS, an engine
key), a chat body, and a bounded wait for the gRPC server's port."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

TOML = """
[[tiers]]
name = "small"
default_max_tokens = 64
backends = [{ kind = "openai", url = "http://127.0.0.1:9101", model = "m-small" }]

[[tiers]]
name = "medium"
system_prompt = "Think step by step."
backends = [{ kind = "sglang", url = "http://127.0.0.1:9102/engine" },
            { kind = "sglang", url = "http://127.0.0.1:9103/engine" }]

[[tiers]]
name = "large"
backends = [{ kind = "openai", url = "https://large.internal:8443", model = "m-large", api_key = "sk-engine" }]
"""


def chat(**fields: object) -> bytes:
    return json.dumps({"model": "cascade", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                       **fields}).encode()


def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, within_s: float = 30) -> None:
    """Until 127.0.0.1:`port` accepts a connection; RuntimeError, with the end of `log`, when `proc` exits first or
    `within_s` passes."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {port}:\n{log.read_text()[-2000:]}") from None
            time.sleep(0.05)
