"""Black-box load generator for OpenAI-compatible endpoints (`cascade loadgen`).

Imports only `cascade.schemas` from cascade, so it works against any OpenAI-compatible URL.
"""
