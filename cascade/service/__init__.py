"""The request core: one request from its decoded body to its answer, usage and bill, with no web framework.

The HTTP adapters (cascade/gateway/) and the Envoy model picker (cascade/extproc/) both call it; neither imports the
other."""
