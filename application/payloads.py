"""Reading the payloads events name by reference (docs/adr/0027-payloads-stored-once.md).

An aggregate knows its payload's reference and, when it was written or upcast in this process,
its bytes; otherwise the bytes are read from the payload store, several in one round trip. A
pruned payload reads as None with its tombstone, which every surface shows the same way
(`pruned_note`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from application.ports import PayloadSource
from application.presenters import iso, todo_full
from domain.bodies import read_payload
from domain.events import DomainEvent
from domain.payloads import JSON, PAYLOAD_FIELDS, TEXT, Pruned
from domain.todo import Todo, TodoOpened


class PayloadMissing(Exception):
    """Raised when an event names bytes the payload store does not hold, not even as a prune's
    tombstone: a damaged store, never a refusal."""


@dataclass(frozen=True)
class Shown:
    """A payload as the surfaces show it: the value, or None and the tombstone of its prune."""

    value: Any = None
    pruned: Pruned | None = None


def pruned_note(pruned: Pruned | None, noun: str = "payload") -> dict[str, Any] | None:
    """`{pruned_at, sha256, size, text}` — text: `payload pruned at <time> (sha256 <hex>, <n> bytes)`."""
    if pruned is None:
        return None
    at = iso(pruned.at)
    return {"pruned_at": at, "sha256": pruned.sha256, "size": pruned.size, "text": pruned.sentence(at, noun)}


Slot = tuple[dict[str, Any] | None, str | None, bytes | None]
"""(reference, form, bytes at hand) of one payload."""


def _not_at_hand(slots: Sequence[Slot]) -> list[str]:
    return [ref["sha256"] for ref, _, data in slots if ref is not None and data is None]


def show_all(source: PayloadSource, slots: Sequence[Slot], *, content_types: Sequence[str | None] = ()) -> list[Shown]:
    """Each slot's payload, reading the bytes not at hand in one round trip."""
    wanted = _not_at_hand(slots)
    stored = source.read_payloads(wanted) if wanted else {}
    shown: list[Shown] = []
    for n, (ref, form, data) in enumerate(slots):
        if ref is None:
            shown.append(Shown())
            continue
        if data is None:
            row = stored.get(ref["sha256"])
            if row is None:
                raise PayloadMissing(f"payload sha256 {ref['sha256']} is missing from the store")
            if row.data is None:
                shown.append(Shown(None, row.pruned))
                continue
            data = row.data
        content_type = content_types[n] if n < len(content_types) else None
        shown.append(Shown(read_payload(data, form, content_type)))
    return shown


def _slots(todos: Sequence[Todo]) -> list[Slot]:
    """Each todo's payload and result, in that order."""
    slots: list[Slot] = []
    for todo in todos:
        slots.append((todo.payload_ref, todo.payload_form, todo.payload_bytes))
        slots.append((todo.result_ref, "json", todo.result_bytes))
    return slots


def unread(todos: Sequence[Todo]) -> list[str]:
    """The digests `full_todos` reads for these todos: those whose bytes are not at hand (a todo
    written or upcast in this process holds its own). A command whose answer is a full todo asks
    its unit of work for them, so they are read before its change commits (docs/adr/0027)."""
    return _not_at_hand(_slots(todos))


def full_todos(source: PayloadSource, todos: Sequence[Todo], fences: Sequence[str | None] = ()) -> list[dict[str, Any]]:
    """Full todos (CONTRACT §6) with their payloads and results read from `source` (after a
    change: what the command's unit of work read before it committed, `unread`)."""
    shown = show_all(source, _slots(todos))
    full = []
    for n, todo in enumerate(todos):
        payload, result = shown[2 * n], shown[2 * n + 1]
        one = todo_full(todo, payload=payload.value, result=result.value,
                        lease_token=fences[n] if n < len(fences) else None)
        if payload.pruned is not None:
            one["payload_pruned"] = pruned_note(payload.pruned)
        if result.pruned is not None:
            one["result_pruned"] = pruned_note(result.pruned, "result")
        full.append(one)
    return full


def delivery_payload(source: PayloadSource, delivery: Any) -> tuple[bytes | None, Any, Pruned | None]:
    """A delivery's body, its payload (None when the body is not JSON) and the tombstone of a prune."""
    data = delivery.body_bytes
    if data is None:
        row = source.read_payloads([delivery.body_ref["sha256"]]).get(delivery.body_ref["sha256"])
        if row is None:
            raise PayloadMissing(f"body sha256 {delivery.body_ref['sha256']} is missing from the store")
        if row.data is None:
            return None, None, row.pruned
        data = row.data
    form = delivery.payload_form
    payload = None if form == TEXT else read_payload(data, form, delivery.content_type)
    return data, payload, None



OMITTED = object()
"""A payload left out of a history on purpose (the reader shows it elsewhere): named in `omitted`."""
HIDDEN = object()
"""A field of the stored event a history does not show (how a payload is stored)."""


def history_payloads(source: PayloadSource, events: Sequence[DomainEvent], *, payloads: bool = True) -> list[dict[str, Any]]:
    """Per event, the data fields that show its payloads as before payloads were stored once:
    `payload` / `result` with the value (their `*_ref` and `payload_form` OMITTED: the audit
    export shows references), `payload_pruned` / `result_pruned` after a prune; with
    `payloads=False` a todo's payload is OMITTED too (results are small and always shown)."""
    slots: list[Slot] = []
    names: list[list[str]] = []
    for event in events:
        names.append([])
        for inline, reference, carried in PAYLOAD_FIELDS.get(type(event).__name__, ()):
            ref = getattr(event, reference)
            if ref is None or (inline == "payload" and not payloads):
                continue
            form = getattr(event, "payload_form", None) if inline == "payload" else JSON
            slots.append((ref, form, getattr(event, carried)))
            names[-1].append(inline)
    shown = iter(show_all(source, slots))
    fields: list[dict[str, Any]] = []
    for event, named in zip(events, names):
        these: dict[str, Any] = {}
        for inline, reference, _ in PAYLOAD_FIELDS.get(type(event).__name__, ()):
            these[reference] = HIDDEN
        if isinstance(event, TodoOpened):
            these["payload_form"] = HIDDEN
        if not payloads and getattr(event, "payload_ref", None) is not None:
            these["payload"] = OMITTED
        for inline in named:
            one = next(shown)
            these[inline] = one.value
            if one.pruned is not None:
                these[f"{inline}_pruned"] = pruned_note(one.pruned, inline)
        fields.append(these)
    return fields
