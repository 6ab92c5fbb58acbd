"""The values a todo carries and their limits: titles, summaries, claimants, results, checkpoints,
trust modes.

Each check is pure: a title becomes one line of at most 200 characters, a summary or claimant is
cut to its byte limit without splitting a character, a result must be JSON of at most 64 KiB
(named in its event by reference to its bytes, docs/adr/0027), and so must a heartbeat's
checkpoint (carried inline in its event, docs/adr/0040).
"""

from __future__ import annotations

import json
from typing import Any

from domain.errors import InvalidArgument
from domain.payloads import json_stored

SUMMARY_MAX_BYTES = 2048
CLAIMANT_MAX_BYTES = 128
TITLE_MAX_CHARS = 200
RESULT_MAX_BYTES = 64 * 1024
CHECKPOINT_MAX_BYTES = 64 * 1024
TRUST_MODES = ("signed", "token", "operator")


def cut_utf8(text: str | None, max_bytes: int) -> str | None:
    """Cuts text to at most max_bytes of UTF-8 without splitting a character."""
    if text is None:
        return None
    encoded = text.encode(errors="replace")  # a lone surrogate becomes "?"
    if len(encoded) <= max_bytes:
        return encoded.decode()
    return encoded[:max_bytes].decode(errors="ignore")


def one_line_title(title: str) -> str:
    """A title is one line of at most 200 characters."""
    line = " ".join(str(title).split())
    return line[: TITLE_MAX_CHARS - 1] + "…" if len(line) > TITLE_MAX_CHARS else line


def check_result(result: Any) -> Any:
    """A result is any JSON value of at most 64 KiB encoded."""
    return _check_json(result, "result", RESULT_MAX_BYTES)


def check_checkpoint(checkpoint: Any) -> Any:
    """A checkpoint is any JSON value of at most 64 KiB encoded (None: no checkpoint)."""
    return _check_json(checkpoint, "checkpoint", CHECKPOINT_MAX_BYTES)


def _check_json(value: Any, name: str, max_bytes: int) -> Any:
    if value is None:  # most completions carry none; json.dumps would build an encoder for it
        return None
    try:
        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(encoded.encode())
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} must be JSON") from None
    if size > max_bytes:
        raise InvalidArgument(f"{name} is {size} bytes, over the {max_bytes}-byte limit")
    return value


def result_fields(result: Any) -> dict[str, Any]:
    """A checked result as an event names it: by reference to its bytes (none for no result)."""
    if check_result(result) is None:
        return {}
    ref, data = json_stored(result)
    return {"result_ref": ref, "result_bytes": data}
