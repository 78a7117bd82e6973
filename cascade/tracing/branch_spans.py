"""A branch run's spans as the branch runner reports into them: the protocol every tracer implements, and the one that
records nothing (tracing off). In a module of its own so that the tracers (otel.py) import it without importing the
package that imports them."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping


class BranchSpans:
    """A branch run's spans, as the branch runner (cascade/branches/runner.py) reports into them. This one, used
    when tracing is off, records nothing."""

    def context(self, index: int) -> contextvars.Context | None:
        """The context to run branch `index`'s task in (its span current), started now; None: the caller's."""
        return None

    def left(self, index: int, state: str, tokens: int, score: float | None) -> None:
        """Branch `index` left the race: `state` is finished, pruned, stopped or failed."""

    def voted(self, chosen: int, finished: int, votes: Mapping[str, int], answer: str | None) -> None:
        """The finished branches voted: `chosen` is returned, `answer` (text: shown only with capture_text)."""
