"""Fake engines for tests and benchmarks: servers that speak an engine's wire without a model.

engine.py (`FakeEngine`: an OpenAI-compatible engine, `cascade fake-server`), script.py (`FakeScript`: what a fake
does for a request, its fault modes and the per-request ``[fake ...]`` directives), garbage.py (a raw TCP server
answering bytes that are not HTTP), prefix_cache.py (the fake engine's prefix cache), sglang.py (`FakeSGLang`:
SGLang's OpenAI route and native endpoints), sglang_shapes.py (the JSON it sends, in SGLang's shapes) and
sglang_metrics.py (its scheduler as SGLang's /metrics shows it); gpu.py (`GpuSGLang`: that fake SGLang emulating a GPU
from a measured profile, `cascade fake-server --gpu-profile`), gpu_batch.py (its continuous-batching scheduler and KV
cache), answers.py (what it answers: the `AnswerSource` seam) and gpu_profiles.py (measured GPU step times turned into
profiles). The ASGI helpers they share are real code:
cascade/engines/asgi.py.
"""
