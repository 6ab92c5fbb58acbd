"""What a command gives back: its exit code, and its answer on stdout as text or (`--json`) one JSON
document; a listing with more rows than it showed says how to get the rest."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, document: Any, text: Callable[[Any], str] | None = None) -> None:
        if self.as_json:
            print(json.dumps(document, indent=2, sort_keys=False, default=str))
        else:
            print(text(document) if text else pairs(document))


def pairs(document: dict[str, Any]) -> str:
    lines = []
    for key, value in document.items():
        shown = (json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list))
                 else ("" if value is None else value))
        lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    head = "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths))
    return "\n".join([head] + ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells])


def more_hint(page: dict[str, Any], noun: str, argv: Sequence[str]) -> None:
    """A listing that has more rows than it showed says so, on stderr: how to get the rest."""
    cursor = page.get("next_cursor")
    if cursor is None:
        return
    kept = []
    skip = False
    for arg in argv:  # the same command again, with --cursor replaced
        if skip:
            skip = False
        elif arg == "--cursor":
            skip = True
        elif not arg.startswith("--cursor="):
            kept.append(arg)
    shown = " ".join(shlex.quote(a) for a in kept)
    print(f"more {noun} than the {len(page[noun])} shown; next page: switchboard {shown} --cursor {cursor}",
          file=sys.stderr)
