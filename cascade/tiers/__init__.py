"""The tier layer: a config's tier ladder as live objects, run, and answered on. Shared by the gateway, the Envoy
model picker, `cascade label` and `cascade bench`, so that every caller talks to a tier the same way.

    build.py      `Tier` and `build_tiers`: config tiers -> backends (replica pools), scorers, the workers they run on
    lifecycle.py  `TierFleet` / `running_tiers`: a config's tiers and their workers, started and stopped as one
    answer.py     a tier's answer to one conversation, whole or live, one branch or SART branches
    upstream.py   what a tier sends its engine: sampling, the request template, seeds and request ids, and the
                  client's request rewritten for the engine (`engine_request`, the picker's body)

Import rules (pyproject.toml [tool.importlinter]): on the online path, so never the optimizer stack; below the
request core and its adapters, so never cascade.service, gateway/, extproc/ or the CLI.
"""
