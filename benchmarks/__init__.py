"""Benchmarks, by concern: each module runs from the repository root as `python -m benchmarks.<concern>.<name>`
(`--help` lists its options) and prints its JSON result, and writes its --json-out or --out file, through
cascade.testing.scripts (print_result, write_result). How to read each: README.md; committed results: results/.

frontdoor/ (what clients meet: gateway overhead, hostile clients, connection limits, SSE, overload, peers, tracing,
the Envoy picker, replica choice, the dashboard), reasoning/ (branches, votes, SART and DeepConf replays, scorers),
router/ (quality, domain check, latency, learning curve, confidence, labelled outcomes, load-reactive routing),
planner/ (solve time, simulator, Cascadia scenario, plan widths, engine speed, ladder footprint), soaks/ (faults,
scale-out, worker drift).
"""
