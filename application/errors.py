"""Application-level errors beyond the domain's refusals."""

from __future__ import annotations

from domain.errors import DomainError


class ConfigurationError(Exception):
    """Raised when settings are unusable (bad URL, short token); stops `serve` at start."""


class StoreUnavailable(Exception):
    """Raised when the database cannot be reached."""


class RetryLimitExceeded(DomainError):
    """Raised when a command kept losing optimistic-concurrency races and gave up."""

    code = "conflict"


class CommitOutcomeUnknown(Exception):
    """Raised when a commit was sent, its answer lost, and the store could not be asked in time
    whether it committed: neither "stored" nor "nothing stored" can be said (never a 503)."""


def first_line(error: BaseException) -> str:
    """An error's first line (psycopg's carry a DETAIL and a HINT below it), without the "store
    unavailable: " its wrappers put in front: for one-line logs."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    while line.startswith("store unavailable: "):
        line = line[len("store unavailable: "):]
    return line
