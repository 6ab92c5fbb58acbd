"""An attempt: one claim of a todo, as the aggregate keeps it; closed ones keep their outcome.

The claims themselves are events (domain/todo.py: `TodoClaimed` opens one, the events of
`ENDS_A_CLAIM` close it); this is the record a todo's state holds of each, and how many earlier
ones its full view shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

PRIOR_ATTEMPTS_SHOWN = 5


@dataclass(frozen=True)
class Attempt:
    """One claim of a todo; closed attempts keep their outcome and summary."""

    seq: int
    claimant: str | None
    claimed_at: datetime
    ended_at: datetime | None = None
    outcome: str | None = None
    summary: str | None = None

    def closed(self, at: datetime, outcome: str, summary: str | None) -> Attempt:
        """This attempt ended at `at` with `outcome`."""
        return Attempt(self.seq, self.claimant, self.claimed_at, at, outcome, summary)
