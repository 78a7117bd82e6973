"""Front-door benchmarks: what the gateway (and Envoy with the model picker) adds and withstands in front of
engines: overhead, hostile clients, connection limits, SSE, overload, peer gateways, tracing, replica choice."""
