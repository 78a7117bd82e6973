"""What benchmark scripts share: `fail`, a script's one-line error exit."""

from __future__ import annotations

import sys
from pathlib import Path


def fail(message: str, prog: str | None = None) -> int:
    """Print `prog: message` to stderr (default prog: the running script's name) and return exit status 2."""
    print(f"{prog or Path(sys.argv[0]).stem}: {message}", file=sys.stderr)
    return 2
