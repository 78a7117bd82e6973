"""Prompts the learned-router tests route (the router itself: `router_dir` in tests/conftest.py)."""

EASY = "Sam buys 3 apples for $2 each. How much does he pay in total?"
HARD = ". ".join(f"Sam buys {k + 11} apples for ${k + 2} each" for k in range(6)) + ". How much does he pay in total?"
