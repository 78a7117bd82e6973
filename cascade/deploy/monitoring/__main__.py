"""`python -m cascade.deploy.monitoring OUT_DIR`: write the Grafana dashboard and the Prometheus rules."""

import sys

from cascade.deploy.monitoring import main

if __name__ == "__main__":  # importing the package's modules (tests walk them all) must not run it
    sys.exit(main())
