"""Black-box load generator for OpenAI-compatible endpoints (`cascade loadgen`).

Imports only `cascade.schemas` and the neutral `cascade.data` from cascade, so it works against any
OpenAI-compatible URL.
"""
