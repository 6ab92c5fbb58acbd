"""Leases: how long a claim holds a todo, and how a holder proves the lease is theirs.

A requested lease is clamped to the endpoint's default (else 300 s) and to at most a day; a
fenced lease stores only the SHA-256 of its token, and every command of the holder is checked
against the holder, the expiry and that hash.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from domain.errors import Conflict

DEFAULT_LEASE = timedelta(seconds=300)
MIN_DEFAULT_LEASE = timedelta(seconds=60)
MAX_LEASE = timedelta(seconds=86400)


def effective_lease(requested_seconds: float | None, default: timedelta | None) -> timedelta:
    """Absent or <= 0 takes the endpoint's default (else 300 s); above 86400 s is clamped."""
    if requested_seconds is None or not requested_seconds > 0:
        return default or DEFAULT_LEASE
    if requested_seconds >= MAX_LEASE.total_seconds():
        return MAX_LEASE
    return timedelta(seconds=requested_seconds)


def fence_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_lease(todo_id: str, *, held_by: str | None, expires_at: datetime | None, fenced_by: str | None,
                now: datetime, holder: str, fence_token: str | None) -> None:
    """A claimed todo's lease is `holder`'s, unexpired, and (when fenced) proven by its token."""
    if held_by != holder:
        raise Conflict(f"todo {todo_id} is leased by another holder")
    if expires_at is not None and expires_at <= now:
        raise Conflict(f"the lease on todo {todo_id} has expired")
    if fenced_by is not None:
        if fence_token is None:
            raise Conflict(f"todo {todo_id} is fenced: lease_token required")
        if fence_hash(fence_token) != fenced_by:
            raise Conflict(f"lease_token does not match the lease on todo {todo_id}")
