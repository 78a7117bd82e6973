"""Dashboards and alerts for a cascade deployment (docs/operations.md, "Dashboards and alerts").

    dashboard.py  the Grafana dashboard: one table of panels over the gateway's series
    alerts.py     Prometheus alerting rules: one table of rules, written as a rule file
    promql.py     the metric names a PromQL expression reads (the tests check them against /metrics)

`files()` is what `python -m cascade.deploy.monitoring OUT` and `cascade deploy --gateways` write; the copies
checked in under deploy/monitoring/ are kept equal to it by tests/deploy/test_monitoring.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cascade.deploy.monitoring import alerts, dashboard

DASHBOARD_FILE = "cascade-dashboard.json"
RULES_FILE = "cascade-alerts.yml"


def files() -> dict[str, str]:
    """File name -> text."""
    return {DASHBOARD_FILE: json.dumps(dashboard.grafana(), indent=2) + "\n", RULES_FILE: alerts.rules_yaml()}


def expressions() -> list[str]:
    """Every PromQL expression the dashboard and the rules hold."""
    return dashboard.expressions() + [r.expr for r in alerts.RULES]


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files().items():
        (out / name).write_text(text)
        written.append(out / name)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m cascade.deploy.monitoring OUT_DIR  (writes the Grafana dashboard and the "
              "Prometheus rules; deploy/monitoring is the checked-in copy)", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in write(Path(args[0]))))
    return 0
