"""`cascade bench branches`: methods.py (the methods, their settings and one method's replay), targets.py (which
tier each method runs on and how it decodes), runs.py (the methods' runs, resumable), out_of_fold.py (a branch
setting chosen out of sample: nested cross-validation over questions), cli.py (argparse wiring).

Empty on purpose: `cascade.bench.cli` is imported by every `cascade` command and must stay argparse-only."""
