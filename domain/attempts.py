"""An attempt: one claim of a todo, as the aggregate keeps it; closed ones keep their outcome.

The claims themselves are events (domain/todo.py: `TodoClaimed` opens one, the events of
`ENDS_A_CLAIM` close it); this is the record a todo's state holds of each, and how many earlier
ones its full view shows. Each attempt carries its span of the todo's trace (domain/traces.py)
and the latest checkpoint its holder saved with a heartbeat (`LeaseRenewed.checkpoint`).

Two vocabularies of outcome, both kept: `prior_attempts` (CONTRACT §6) names how the claim ended
as the events say (`completed`, `failed`, `released`, `lease_expired`, `revoked`); `attempts`
(CONTRACT §18) tells a holder that died (`lapsed`) from one that failed or handed the todo back
(`released`, which an endpoint's revocation also is: its held leases are released), and the open
attempt reads `claimed`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PRIOR_ATTEMPTS_SHOWN = 5

CLAIMED, LAPSED = "claimed", "lapsed"
ATTEMPT_OUTCOMES = ("completed", "failed", LAPSED, "released", CLAIMED)
_OUTCOME_OF = {"completed": "completed", "failed": "failed", "lease_expired": LAPSED,
               "released": "released", "revoked": "released"}


@dataclass(frozen=True)
class Attempt:
    """One claim of a todo; closed attempts keep their outcome and summary."""

    seq: int
    claimant: str | None
    claimed_at: datetime
    ended_at: datetime | None = None
    outcome: str | None = None
    summary: str | None = None
    span_id: str | None = None
    checkpoint: Any = None
    """The latest checkpoint saved during this attempt (None: none)."""

    def closed(self, at: datetime, outcome: str, summary: str | None) -> Attempt:
        """This attempt ended at `at` with `outcome`."""
        return dataclasses.replace(self, ended_at=at, outcome=outcome, summary=summary)

    def checkpointed(self, checkpoint: Any) -> Attempt:
        """This attempt with its holder's latest checkpoint."""
        return dataclasses.replace(self, checkpoint=checkpoint)

    @property
    def told(self) -> str:
        """The outcome as `attempts` tells it: completed, failed, lapsed, released, or claimed."""
        return CLAIMED if self.outcome is None else _OUTCOME_OF.get(self.outcome, self.outcome)
