"""Data every part of cascade reads: datasets (prompts with references), the answer grader, the
outcomes rows `cascade label` writes, and the load generator's per-request records.

Neutral ground: it imports nothing else of cascade, so the online path (gateway, router, branches),
the offline tools and the black-box load generator can all depend on it without depending on each other.
"""
