"""The audit log: the export with its hash chain, sealing, the head, and verification.

The chain's rule and canonical form are in domain/audit.py (and docs/audit.md); here they meet
the store: `seal` links every event after the head, `export` prints each event with the hashes
it was sealed with, `verify` re-computes the chain over the store or over an export file.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from application.background import _loop as run_loop
from application.ports import Clock
from domain.audit import (
    ALTERED, DUPLICATED, INSERTED, MISSING, OUT_OF_ORDER, PAYLOADS, SECRET_FIELDS, ZERO_HASH, Break, Chain, Encode,
    canonical_json, canonical_line, chain_hash, check_digests, check_order, export_parts, payload_entry,
)
from domain.delivery import DELIVERY_PREFIX
from domain.names import ENDPOINT_PREFIX, OPERATOR_PREFIX, TODO_PREFIX
from domain.webhook import WEBHOOK_PREFIX

PAGE = 1000
PAYLOAD_BATCH_BYTES = 16 * 1024 * 1024  # `export --payloads` reads payloads in batches of about this much
log = logging.getLogger("switchboard.audit")

# The public name of each aggregate type, by the module its events live in, and its id prefix:
# the export names aggregates as every other surface does (`td_…`), not by bare hex.
AGGREGATE_NAMES = {
    "domain.todo_events": ("todo", TODO_PREFIX), "domain.endpoint": ("endpoint", ENDPOINT_PREFIX),
    "domain.webhook": ("webhook", WEBHOOK_PREFIX), "domain.delivery": ("delivery", DELIVERY_PREFIX),
    "domain.operator": ("operator", OPERATOR_PREFIX),
    "domain.idempotency": ("idempotency_key", "ik_"), "domain.once": ("once_key", "ok_"),
    "domain.installation": ("installation", "in_"),
    "domain.retention": ("retention", "rt_"),
}


@dataclass(frozen=True)
class LoggedEvent:
    """An event as the log holds it: its fields as JSON-ready builtins (timestamp, actor, cause among them)."""

    position: int
    aggregate: str  # the aggregate's id, 32 hex digits
    version: int
    type: str
    module: str  # where its class lives, which names its aggregate type
    data: dict[str, Any]
    floats: bool = True  # whether its data may hold a float (False: known to hold none)


@dataclass(frozen=True)
class Unreadable:
    """A stored event that cannot be decoded (its bytes were changed, or its type is unknown)."""

    position: int
    reason: str


@dataclass(frozen=True)
class Sealed:
    """The chain's head: the last sealed position, its hash, its event's time, when it was sealed (µs)."""

    position: int
    hash: str
    time: str | None
    sealed_at: int | None


class ChainStore(Protocol):
    """Where the chain lives: the raw log, the sealed links and their head."""

    def read(self, after: int, limit: int, stop: int | None = None) -> list[LoggedEvent | Unreadable]: ...

    def head(self) -> Sealed: ...

    def seals(self, after: int, stop: int | None, limit: int) -> list[tuple[int, str]]: ...

    def hash_at_or_before(self, position: int) -> str | None: ...

    def count_after(self, position: int) -> int: ...

    def last_position(self) -> int:
        """The log's last position (0 when empty)."""
        ...

    def seal(self, link: Callable[[str, Sequence[LoggedEvent | Unreadable]], list[tuple[int, str, str]]],
             now: Callable[[], Any]) -> int: ...

    def payloads(self, digests: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of these SHA-256 digests; pruned (and unknown) ones are left out."""
        ...


def record_of(event: LoggedEvent, encode: Encode = canonical_json) -> dict[str, Any]:
    """The export line of an event, without its hashes: aggregates by public id, its data as the
    log holds it (references moved to `digests`, secrets withheld). The one definition of a line:
    `audit export`, `app.audit()` and the chain all read it."""
    data = dict(event.data)
    time, actor, cause = data.pop("timestamp"), data.pop("actor"), data.pop("cause")
    kind, prefix = AGGREGATE_NAMES.get(event.module, (event.module.rpartition(".")[2], ""))
    data, digests = export_parts(event.type, data, encode)
    record = {
        "position": event.position, "time": time, "aggregate": f"{prefix}{event.aggregate}",
        "aggregate_type": kind, "version": event.version, "type": event.type, "actor": actor, "cause": cause,
        "data": data,
    }
    if digests:
        record["digests"] = digests
    return record


@dataclass(frozen=True)
class Verdict:
    """An intact chain: how many events, from which hash (zero for a whole log), to which head."""

    count: int
    head: str
    start: str = ZERO_HASH
    first: int | None = None
    unsealed: int = 0

    def __str__(self) -> str:
        text = f"chain intact: {self.count} events, head {self.head}"
        if self.start != ZERO_HASH:
            text += f" (from position {self.first}, after prev_hash {self.start})"
        if self.unsealed:
            text += f"; {self.unsealed} newer events not sealed yet"
        return text


class AuditLog:
    """Seals, exports and verifies the log."""

    def __init__(self, chain: ChainStore, clock: Clock, fast: Encode | None = None) -> None:
        self.chain = chain
        self.clock = clock
        self.fast = fast
        """An encoder that gives `canonical_json`'s bytes, faster, for values without floats."""
        self.stuck: Unreadable | None = None
        """The event sealing last stopped before, if it could not be read."""

    def encoder(self, floats: bool) -> Encode:
        return canonical_json if floats or self.fast is None else self.fast

    def record(self, event: LoggedEvent) -> tuple[dict[str, Any], Encode]:
        encode = self.encoder(event.floats)
        return record_of(event, encode), encode

    def link(self, prev_hash: str, events: Sequence[LoggedEvent | Unreadable]) -> list[tuple[int, str, str]]:
        """(position, hash, time) of each event chained after `prev_hash`, up to the first unreadable one."""
        links = []
        for event in events:
            if isinstance(event, Unreadable):
                self.stuck = event  # sealing stops before it: `audit verify` names it
                break
            record, encode = self.record(event)
            prev_hash = chain_hash(prev_hash, canonical_line(record, encode))
            links.append((event.position, prev_hash, record["time"]))
        return links

    def seal(self) -> int:
        """Seals every event not yet sealed; returns how many."""
        return self.chain.seal(self.link, self.clock.now)

    def head(self) -> dict[str, Any]:
        """The last sealed link: `{position, hash, time}` (time of its event)."""
        head = self.chain.head()
        return {"position": head.position, "hash": head.hash, "time": head.time}

    def behind(self) -> tuple[int, int]:
        """(the head's position, the log's last position): two cheap reads, no page."""
        return self.chain.head().position, self.chain.last_position()

    def unsealed(self) -> int:
        """How many events were appended after the head (0 when every event is sealed)."""
        return self.chain.count_after(self.chain.head().position)

    def export(self, *, after: int = 0, payloads: bool = False) -> Iterator[dict[str, Any]]:
        """Every event from a position as its export line, with the hashes it was sealed with.

        `prev_hash` is the sealed link before it, so a file made from a store whose event was
        deleted after sealing shows that event missing, as `audit verify` on the store does.
        With `payloads`, a line whose event names stored bytes by reference carries those still
        stored under `payloads` (`{sha256: {encoding, content}}`; pruned ones absent).
        """
        self.seal()
        prev = self.chain.hash_at_or_before(after) or ZERO_HASH if after > 0 else ZERO_HASH
        while True:
            events = self.chain.read(after, PAGE)
            if not events:
                return
            stop = events[-1].position
            seals = self.chain.seals(after, stop, stop - after)
            if len(seals) < len(events) and self.seal():  # appended since the seal above
                seals = self.chain.seals(after, stop, stop - after)
            batch: list[tuple[dict[str, Any], list[str]]] = []  # with --payloads: records waiting for theirs
            weight = 0
            for _, hash_, event in _merge(iter(events), iter(seals)):
                if event is None:  # sealed, and gone from the log
                    prev = hash_
                    continue
                if isinstance(event, Unreadable):
                    yield from self._with_payloads(batch)
                    raise Break(event.position, ALTERED, f"{event.reason}; `audit verify` checks the whole log")
                record = record_of(event, self.encoder(event.floats))
                record["prev_hash"], record["hash"] = prev, hash_
                if hash_ is not None:
                    prev = hash_
                if not payloads:
                    yield record
                    continue
                named = [ref for name, ref in record.get("digests", {}).items()
                         if name not in record["data"] and name not in SECRET_FIELDS]  # by reference, not secret
                batch.append((record, [ref["sha256"] for ref in named]))
                weight += sum(ref["size"] for ref in named)
                if weight >= PAYLOAD_BATCH_BYTES:
                    yield from self._with_payloads(batch)
                    batch, weight = [], 0
            yield from self._with_payloads(batch)
            after = stop

    def _with_payloads(self, batch: list[tuple[dict[str, Any], list[str]]]) -> list[dict[str, Any]]:
        """The records, each carrying the stored bytes of the digests it names (one read per batch)."""
        stored = self.chain.payloads(sorted({d for _, digests in batch for d in digests}))
        records = []
        for record, digests in batch:
            held = {d: payload_entry(d, stored[d]) for d in digests if d in stored}
            if held:
                record[PAYLOADS] = held
                record["prev_hash"], record["hash"] = record.pop("prev_hash"), record.pop("hash")  # hashes last
            records.append(record)
        return records

    # -- verifying

    def verify(self) -> Verdict:
        """Re-computes the chain over the store (after sealing what is new); raises Break at the first bad position."""
        self.seal()
        head = self.chain.head()
        chain = Chain()
        unsealed = 0
        for position, hash_, event in _merge(self._events(), self._seals()):
            if event is None:
                raise Break(position, MISSING, "it was sealed, and is no longer in the log")
            if isinstance(event, Unreadable):
                raise Break(position, ALTERED, event.reason)
            record, encode = self.record(event)
            if hash_ is None:
                if position > head.position:
                    unsealed += 1  # appended since this verify sealed
                    continue
                seen = chain.seen(record["aggregate"], record["version"])
                if seen is not None:
                    raise Break(position, DUPLICATED, f"{record['aggregate']} version {record['version']} is already "
                                                      f"in the log (position {seen}); this copy was never sealed")
                raise Break(position, INSERTED, "an event that was never sealed stands among sealed ones")
            record["prev_hash"], record["hash"] = chain.head, hash_
            try:
                chain.add(record, encode, check_values=False)
            except Break as error:
                if error.kind == ALTERED:
                    moved = self._sealed_elsewhere(record, encode)
                    if moved is not None:
                        raise Break(position, OUT_OF_ORDER, f"its event was sealed at position {moved}") from None
                raise
        return Verdict(chain.count, chain.head, unsealed=unsealed)

    def _events(self) -> Iterator[LoggedEvent | Unreadable]:
        after = 0
        while events := self.chain.read(after, PAGE):
            yield from events
            after = events[-1].position

    def _seals(self, after: int = 0) -> Iterator[tuple[int, str]]:
        while seals := self.chain.seals(after, None, PAGE):
            yield from seals
            after = seals[-1][0]

    def _sealed_elsewhere(self, record: dict[str, Any], encode: Encode) -> int | None:
        """The later position whose link this event's line makes (a swap or a move), if any."""
        prev = self.chain.hash_at_or_before(record["position"])
        for position, hash_ in self._seals(record["position"]):
            if prev is not None and chain_hash(prev, canonical_line({**record, "position": position}, encode)) == hash_:
                return position
            prev = hash_
        return None


def _merge(events: Iterator[LoggedEvent | Unreadable], seals: Iterator[tuple[int, str]]
           ) -> Iterator[tuple[int, str | None, LoggedEvent | Unreadable | None]]:
    """(position, sealed hash or None, event or None) in position order, over both sides."""
    event, seal = next(events, None), next(seals, None)
    while event is not None or seal is not None:
        if seal is None or (event is not None and event.position < seal[0]):
            yield event.position, None, event
            event = next(events, None)
        elif event is None or seal[0] < event.position:
            yield seal[0], seal[1], None
            seal = next(seals, None)
        else:
            yield event.position, seal[1], event
            event, seal = next(events, None), next(seals, None)


def verify_lines(open_lines: Callable[[], Iterable[str]], parse: Callable[[str], tuple[Any, bool]],
                 fast: Encode | None = None) -> Verdict:
    """Re-computes the chain over an export's lines, read twice: their positions first (so a line
    duplicated or moved is named as such), then each link. `parse` gives a line's value and whether
    it held a float (`fast` is used for lines without)."""

    def records() -> Iterator[tuple[dict[str, Any], bool]]:
        for number, line in enumerate(open_lines(), 1):
            try:
                record, floats = parse(line)
            except ValueError as error:
                raise Break(None, ALTERED, f"line {number} is not JSON: {error}") from None
            if not isinstance(record, dict) or not isinstance(record.get("position"), int):
                raise Break(None, ALTERED, f"line {number} is not an export line (no position)")
            yield record, floats

    check_order([r["position"] for r, _ in records()])
    chain: Chain | None = None
    first = None
    for record, floats in records():
        if chain is None:
            start = record.get("prev_hash")
            chain, first = Chain(start if isinstance(start, str) else ZERO_HASH), record["position"]
        encode = canonical_json if floats or fast is None else fast
        try:
            chain.add(record, encode)
        except Break as error:
            if error.kind == ALTERED and check_digests(record, encode) is None:
                for later, _ in records():  # its line may make a later position's link: moved there
                    if later["position"] > record["position"] and later.get("hash") == chain_hash(
                            str(later.get("prev_hash")), canonical_line({**record, "position": later["position"]}, encode)):
                        raise Break(record["position"], OUT_OF_ORDER,
                                    f"its event was sealed at position {later['position']}") from None
            raise
    if chain is None:
        return Verdict(0, ZERO_HASH)
    return Verdict(chain.count, chain.head, chain.start, first)


SEAL_EVERY = 0.25
"""Seconds between looks for events to seal (committed by any process): with the time a page takes
to seal, every event is sealed well within 1 s of its commit."""


STANDBY_AFTER = 0.4
"""Seconds an event may wait unsealed, once a standby sealer has seen it, before the standby seals
it (its primary has not)."""

STANDBY_EVERY = 0.1
"""Seconds between a standby's looks (two one-row reads): it sees an event within 0.1 s of its
commit and seals it by ~0.5 s, leaving room under 1 s for a loaded machine (looks 0.25 s apart
left ~0.75 s, and a loaded CI run once measured 1.03 s)."""


class Sealer:
    """Background work of `serve`: seals what any process appended, a few times a second.

    Several processes may run it on one database: the head row's lock lets one seal at a time,
    and the others find nothing left to seal. A `standby` sealer (the one in `serve` itself, whose
    projector process seals: docs/adr/0032) only looks at the head and the log's end, and seals
    only what has waited `standby` seconds, so the chain stays within 1 s while that process
    starts, restarts or is stuck, and costs the serving process almost nothing meanwhile.
    """

    def __init__(self, audit: AuditLog, *, standby: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.audit = audit
        self.wake = threading.Event()
        self.standby = standby
        self.name = "sealer" if standby is None else "standby sealer"
        """The name its log lines carry (each process's loop says once that the store went, once that it is back)."""
        self._monotonic = monotonic
        self._seen: collections.deque[tuple[int, float]] = collections.deque()
        """A standby's looks that found the log past the head: (the log's last position, when)."""
        self._reported: Unreadable | None = None

    def overdue(self) -> bool:
        """For a standby: whether an event has waited unsealed for `standby` seconds since it was
        first seen. The oldest unsealed event (the head's next) was first seen at the first look
        that found the log at or past it; a primary that seals part of what waits does not start
        the rest's wait again."""
        head, last = self.audit.behind()
        now = self._monotonic()
        if last > head and (not self._seen or last > self._seen[-1][0]):
            self._seen.append((last, now))
        while self._seen and self._seen[0][0] <= head:
            self._seen.popleft()  # sealed meanwhile (by the primary)
        return bool(self._seen) and now - self._seen[0][1] >= self.standby

    def tick(self) -> float:
        every = SEAL_EVERY if self.standby is None else STANDBY_EVERY
        if self.standby is not None and not self.overdue():
            return every
        self._seen.clear()
        self.audit.seal()
        stuck = self.audit.stuck
        if stuck is not None and stuck != self._reported:
            log.error("%s: position %s cannot be sealed (%s); `switchboard audit verify` says more",
                      self.name, stuck.position, stuck.reason)
            self._reported = stuck
        return every

    def run(self, stop: threading.Event) -> None:
        run_loop(self.tick, self.wake, stop, self.name)
