"""cascade as an Envoy external processor: stage 1 of an inference gateway (docs/scaling.md).

Envoy sends each chat completion's headers and whole body over its ext_proc gRPC stream; cascade decides the tier
as `cascade serve` would (the same hint parsing, router and request checks: `ChatService.route`), and answers with
`x-cascade-tier` and the body rewritten for that tier's engine, so that Envoy's route on the header picks the
tier's cluster (in Kubernetes, an InferencePool per tier). Route mode only: escalation and reasoning branches stay
in `cascade serve`, which can sit behind Envoy as one more cluster.

    wire.py          the path and header names the picker and Envoy's routes agree on
    engines.py       each tier's engines as Envoy reaches them (one cluster per tier) and what the body names
    picker.py        headers + body -> `Routed` (tier, headers, body) or `Refused` (an OpenAI error): no gRPC here
    processor.py     the ext_proc gRPC service over the picker (envoy-data-plane types, grpcio server)
    cli.py           `cascade extproc` (its `--print-envoy` bootstrap is deploy's: cascade/deploy/cli.py adds the
                     options, cascade/deploy/envoy.py writes the picker topology)

It never imports gateway/ (both are adapters over the request core) nor deploy/ (deploy writes every Envoy document
from what this package exports): import contracts in pyproject.toml.
"""
