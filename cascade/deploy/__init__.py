"""Deployment: from a plan (cascade/optimizer/) to what runs (docs/scaling.md).

    launch.py  `cascade deploy`: start and supervise a plan's engines, write the gateway config pointing at them
    envoy.py   Envoy bootstraps: in front of N gateways (`cascade deploy --gateways`), and in front of the engines
               with the ext_proc model picker (`cascade extproc --print-envoy`)
    kube.py    Kubernetes manifests for N gateways (`cascade deploy --gateways`)
    monitoring/  the Grafana dashboard and Prometheus alerting rules over the gateway's metrics (deploy/monitoring/)
    cli.py     `cascade deploy`

Deployment reads the optimizer's plan types; the optimizer never imports deployment (pyproject.toml's contracts).
"""
