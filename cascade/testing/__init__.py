"""Helpers shared by the tests and the benchmarks (never imported by cascade itself: an import-linter contract, whose
one exemption is the CLI serving the fake engine as `cascade fake-server`).

processes.py (run and stop commands in their own process group), waiting.py (bounded waits for a condition or a
URL), servers.py (the fake engine, `cascade serve` and redis-server as subprocesses), asgi.py (an ASGI app served
in a thread), soak.py (a soak's requests, their verdicts and counts), scripts.py (a benchmark's error exit and its
JSON result), fakes/ (the fake engines: OpenAI-compatible, SGLang, raw TCP garbage).
"""
