"""`serve_asgi`: an ASGI app served in-process (uvicorn, in a thread) on 127.0.0.1 at a free port for a block.

Only the standard library at import time; uvicorn is imported when used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal


@contextmanager
def serve_asgi(app: Any, lifespan: Literal["off", "on"] = "off", startup_timeout_s: float = 10.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 at a free port (uvicorn, in a thread) and yield its base URL; it is stopped
    when the block exits, even on failure."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan,
                            access_log=False, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"test-server-{type(app).__name__}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.002)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():  # a handler that ignores cancellation: stop waiting for it
            server.force_exit = True
            thread.join(timeout=5)
