"""W3C trace context for attempts (CONTRACT §18): one trace id per todo, one span id per attempt.

A todo's trace id is the one its delivery's own `traceparent` header carried (that header is the
parent), else it is minted at open from the todo's id (itself passed in, so the domain stays pure
and a test that picks the id picks the trace). Each claim's span id is derived from the todo's id
and the attempt's `seq`: unique per attempt, the same on every replay, and never all zeros.
Format: https://www.w3.org/TR/trace-context/#traceparent-header — `00-<32 hex>-<16 hex>-<2 hex>`.
"""

from __future__ import annotations

import hashlib
import re
from uuid import UUID

VERSION = "00"
SAMPLED = "01"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def parse_traceparent(header: object) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid `traceparent` header, else None (ignored, as the spec
    asks of a receiver): version `ff` and all-zero ids are invalid; a future version's extra
    fields after the four are allowed."""
    if not isinstance(header, str):
        return None
    text = header.strip().lower()
    match = _TRACEPARENT.match(text)
    if match is None:
        return None
    version, trace_id, span_id, _ = match.groups()
    rest = text[match.end():]
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if (version == VERSION and rest) or (rest and not rest.startswith("-")):
        return None
    return trace_id, span_id


def trace_id_for(todo_id: UUID, parent: str | None) -> str:
    """The todo's trace id: its parent's when the delivery sent a valid `traceparent`, else minted
    from the todo's (random) id."""
    parsed = parse_traceparent(parent)
    return parsed[0] if parsed is not None else todo_id.hex


def span_id_for(todo_id: UUID, seq: int) -> str:
    """The span id of the todo's attempt `seq`: 16 hex, derived, never all zeros."""
    span = hashlib.sha256(todo_id.bytes + seq.to_bytes(8, "big")).hexdigest()[:16]
    return span if span != _ZERO_SPAN else "0" * 15 + "1"


def traceparent(trace_id: str, span_id: str) -> str:
    """`00-<trace id>-<span id>-01`."""
    return f"{VERSION}-{trace_id}-{span_id}-{SAMPLED}"
