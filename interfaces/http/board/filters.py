"""How the board's templates show values: the Jinja filters of `Board.env`."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

PAYLOAD_SHOWN_BYTES = 256 * 1024  # a payload over this is shown cut, with a link to download it whole


def pretty(value: Any) -> str:
    """JSON with indentation (escaped by the template like any text); a plain string as itself."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def compact(value: Any) -> str:
    """JSON on one line."""
    return json.dumps(value, ensure_ascii=False)


def when(value: str | None) -> str:
    """An RFC 3339 time as `YYYY-MM-DD HH:MM:SSZ`."""
    if not value:
        return "—"
    try:
        moment = datetime.fromisoformat(value).astimezone(timezone.utc)
    except ValueError:
        return value
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def size(value: int | None) -> str:
    if value is None:
        return "—"
    for unit in ("B", "KiB", "MiB"):
        if value < 1024 or unit == "MiB":
            return f"{value} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def rule_number(trace: dict[str, Any] | None) -> int | None:
    """The rule a trace names, as a person counts it (from 1); `rule_index` in data counts from 0."""
    index = (trace or {}).get("rule_index")
    return index + 1 if isinstance(index, int) and not isinstance(index, bool) else None


def excerpt(value: Any, limit: int = PAYLOAD_SHOWN_BYTES) -> str:
    """At most `limit` bytes of `pretty(value)`, encoding only what is shown (a cut never pays for the
    rest); a cut falls on a character boundary."""
    if isinstance(value, str):
        text = value[:limit]
    else:
        parts, length = [], 0
        for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(value):
            parts.append(chunk)
            length += len(chunk)  # characters: at least one byte each, so `limit` characters suffice
            if length >= limit:
                break
        text = "".join(parts)
    return text.encode()[:limit].decode(errors="ignore")


FILTERS = {"pretty": pretty, "compact": compact, "when": when, "size": size, "rule_number": rule_number,
           "excerpt": excerpt}
