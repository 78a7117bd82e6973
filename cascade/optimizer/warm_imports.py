"""Import the solver stack once (pymoo, highspy, scipy): a fixed per-process cost that
benchmarks time apart from solving."""

from __future__ import annotations

import highspy  # noqa: F401
from pymoo.algorithms.moo.nsga2 import NSGA2  # noqa: F401
from pymoo.algorithms.soo.nonconvex.ga import GA  # noqa: F401
from pymoo.optimize import minimize  # noqa: F401
