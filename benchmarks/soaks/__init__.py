"""Soaks: long runs that break things on purpose (engine faults, a gateway killed behind Envoy) or watch for drift,
and count every request's verdict."""
