"""Planner benchmarks: solve time, the simulator against a measured load test, the Cascadia scenario, planned
branch widths, and the engine measurements plans read (decode speed, a ladder's footprint)."""
