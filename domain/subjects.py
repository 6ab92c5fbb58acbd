"""The subject of a delivery: what `once` counts by (CONTRACT §13), from its source, kind and payload."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUBJECT_SOURCES = ("github", "gitea")
SUBJECT_KINDS = ("issue", "pull_request")  # issues, issue_comment, pull_request_review, … (and Gitea's)
SUBJECT_PART_MAX_CHARS = 256


def subject_of(source: str, kind: str | None, payload: Any) -> str | None:
    """What `once` counts by: `<source>:<owner>/<repo>#<n>` for an issue or pull-request event of
    github or gitea (`n` from `issue.number`, `pull_request.number` or `number`), `cairn:<data.id>`
    for cairn; None where there is no subject."""
    if not isinstance(payload, Mapping):
        return None
    if source == "cairn":
        data = payload.get("data")
        ident = data.get("id") if isinstance(data, Mapping) else None
        text = _subject_part(ident)
        return f"cairn:{text}" if text else None
    if source not in SUBJECT_SOURCES or not isinstance(kind, str) or not kind.startswith(SUBJECT_KINDS):
        return None
    repo = _repository(payload.get("repository"))
    number = None
    for carrier in (payload.get("issue"), payload.get("pull_request"), payload):
        value = carrier.get("number") if isinstance(carrier, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            number = value
            break
    return f"{source}:{repo}#{number}" if repo and number is not None else None


def _repository(repository: Any) -> str | None:
    if not isinstance(repository, Mapping):
        return None
    full_name = _subject_part(repository.get("full_name"))
    if full_name and "/" in full_name:
        return full_name
    owner = repository.get("owner")
    owner_login = _subject_part(owner.get("login")) if isinstance(owner, Mapping) else None
    name = _subject_part(repository.get("name"))
    return f"{owner_login}/{name}" if owner_login and name else None


def _subject_part(value: Any) -> str | None:
    """A string or integer usable inside a subject (one line, no NUL, at most 256 characters)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip() and len(value) <= SUBJECT_PART_MAX_CHARS and value.isprintable():
        return value
    return None
