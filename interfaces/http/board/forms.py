"""Reading the board's forms and query strings: every field arrives as text (or a list of texts)."""

from __future__ import annotations

import json
import re
from typing import Any

from domain.endpoint import parse_lifetime
from domain.errors import InvalidArgument

Form = dict[str, Any] | None  # a URL-encoded body as Litestar gives it; None when the body is empty


def text(form: Form, name: str) -> str:
    """A field's value, stripped (the last one when the field was sent twice); "" when absent."""
    value = (form or {}).get(name, "")
    if isinstance(value, list):
        value = value[-1] if value else ""
    return str(value).strip()


def every(form: Form, name: str) -> list[str]:
    """Every non-empty value of a field (ticked checkboxes)."""
    value = (form or {}).get(name, [])
    return [str(v) for v in (value if isinstance(value, list) else [value]) if str(v)]


def names(value: str) -> list[str]:
    """Names separated by commas or spaces."""
    return [part for part in re.split(r"[\s,]+", value) if part]


def whole_number(form: Form, name: str, label: str) -> int | None:
    value = text(form, name)
    if not value:
        return None
    if not re.fullmatch(r"-?\d{1,9}", value):
        raise InvalidArgument(f"{label} must be a whole number")
    return int(value)


def json_field(form: Form, name: str, label: str) -> Any:
    value = text(form, name)
    if not value:
        return None
    try:
        return json.loads(value)
    except ValueError as error:
        raise InvalidArgument(f"{label} is not valid JSON: {error}") from None


def lifetime(value: str) -> int | None:
    """A lifetime `<n>s|m|h|d` in seconds, or None for `never` (or nothing)."""
    return parse_lifetime(value) if value.strip() else None


def blank(value: str | None) -> str | None:
    """A query parameter, None when absent or only spaces."""
    return value.strip() if value and value.strip() else None


def safe_next(value: str | None) -> str:
    """A local path to return to after sign-in (never another origin, never /login itself)."""
    if (not value or len(value) > 2048 or not value.startswith("/") or value.startswith(("//", "/\\"))
            or any(c in value for c in "\\\r\n\t ") or value.split("?")[0] in ("/login", "/logout")):
        return "/todos"
    return value
