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
