"""`cascade profile`: probe.py (the live measurement of a backend), fit.py (a live measurement or a finished
`cascade loadgen` run turned into a Profile), cli.py (argparse wiring).

Empty on purpose: `cascade.profiler.cli` is imported by every `cascade` command and must stay argparse-only."""
