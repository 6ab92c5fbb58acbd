"""Domain errors: each carries the stable code that every interface reports."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every refusal the domain or application makes; `code` is stable."""

    code = "invalid_argument"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(DomainError):
    """Raised when an input is malformed or out of range."""

    code = "invalid_argument"


class NotFound(DomainError):
    """Raised when a thing does not exist or is not visible to the caller."""

    code = "not_found"


class Conflict(DomainError):
    """Raised when the thing's current state does not allow the command."""

    code = "conflict"


class Forbidden(DomainError):
    """Raised when the caller's scope does not cover the command."""

    code = "forbidden"


class CeilingExceeded(DomainError):
    """Raised when an endpoint already has as many webhooks as its ceiling allows."""

    code = "ceiling_exceeded"


class ForbiddenSourceType(DomainError):
    """Raised when an endpoint may not create webhooks of that source type."""

    code = "forbidden_source_type"
