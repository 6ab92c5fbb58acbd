"""Queries over the read models (the Views port). All SQL of the read side lives here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from application.ports import QueueLoad
from application.presenters import claimable_from, iso, row
from domain.envelopes import envelope_with_payload
from domain.queue import RATE_WINDOW
from domain.todo import WAITING
from interfaces.store.blobs import TABLE as PAYLOADS, unpack
from interfaces.store.database import Database, LockBusy
from interfaces.store.projector import Projector
from interfaces.store.queues import SqlQueueLoad
from projections.base import from_micros, micros
from projections.todo_rows import COLUMNS


RECLAIM_LOCK_WAIT_MS = 2000
"""How long `retention prune --reclaim` waits for the payload store's exclusive lock."""
CHECKPOINT_WAIT_MS = 2000
"""SQLite: how long a prune's checkpoint waits for readers of older snapshots (writers wait too)."""

_ENVELOPES = (
    "SELECT d.event_id, d.envelope, d.payload_form, b.codec, b.data FROM sb_stored_deliveries d"
    f" LEFT JOIN {PAYLOADS} b ON b.sha256 = d.body_sha256"
)


def _row(values: Sequence[Any]) -> dict[str, Any]:
    r = dict(zip(COLUMNS, values))
    return row(
        todo_id=r["todo_id"], queue=r["queue"], source=r["source"], kind=r["kind"], title=r["title"],
        state=r["state"], trust_mode=r["trust_mode"], owner=r["owner"], attempt=r["attempt"],
        lease_expires_at=from_micros(r["lease_expires_at"]), next_retry_at=from_micros(r["next_retry_at"]),
        dead_letter=bool(r["dead_letter"]), created_at=from_micros(r["created_at"]), payload_size=r["payload_size"],
        available_at=None,  # from the claimable queue, by `_with_available_at`
    )


def queue_counts_sql(where: str = "") -> str:
    """Todos per queue, state and dead-letter flag, with the oldest creation time of each group."""
    return (f"SELECT queue, state, dead_letter, count(*), min(created_at) FROM sb_todo_rows{where}"
            " GROUP BY queue, state, dead_letter ORDER BY queue, state")


class SqlViews:
    """Reads the projections; `catch_up` first gives read-your-writes across processes."""

    def __init__(self, db: Database, projector: Projector) -> None:
        self.db = db
        self.projector = projector

    def catch_up(self) -> None:
        self.projector.catch_up()

    def list_todos(self, *, endpoint_ids: Sequence[str] | None, state: str | None, queue: str | None,
                   limit: int, hide_queues: Sequence[str] = (), dead_letter: bool | None = None,
                   ) -> list[dict[str, Any]]:
        return self.page_todos(endpoint_ids=endpoint_ids, state=state, queue=queue, limit=limit,
                               hide_queues=hide_queues, dead_letter=dead_letter)[0]

    def page_todos(self, *, endpoint_ids: Sequence[str] | None, state: str | None, queue: str | None,
                   limit: int, hide_queues: Sequence[str] = (), dead_letter: bool | None = None,
                   after: tuple[int, str] | None = None) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
        """Rows newest first, after the (created_at, todo_id) of a previous page's last row, and
        that key for this page's last row when more rows follow (else None)."""
        where, params = [], []
        if endpoint_ids is not None:
            if not endpoint_ids:
                return [], None
            where.append(f"endpoint_id IN ({', '.join(['%s'] * len(endpoint_ids))})")
            params.extend(endpoint_ids)
        if state is not None:
            where.append("state = %s")
            params.append(state)
        if queue is not None:
            where.append("queue = %s")
            params.append(queue)
        for hidden in hide_queues:
            where.append("queue <> %s")
            params.append(hidden)
        if dead_letter is not None:
            where.append("dead_letter = %s")
            params.append(int(dead_letter))
        if after is not None:
            where.append("(created_at < %s OR (created_at = %s AND todo_id < %s))")
            params.extend((after[0], after[0], after[1]))
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self.db.query(
            f"SELECT {', '.join(COLUMNS)} FROM sb_todo_rows{clause} ORDER BY created_at DESC, todo_id DESC LIMIT %s",
            (*params, limit + 1),
        )
        more = len(rows) > limit
        rows = rows[:limit]
        last = dict(zip(COLUMNS, rows[-1])) if more and rows else None
        return self._with_available_at([_row(r) for r in rows]), ((last["created_at"], last["todo_id"]) if last else None)

    def _with_available_at(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each row's `available_at` (when it is or was claimable; null while claimed, dead or held in
        quarantine), from the inline claimable queue, which holds it for every todo not done."""
        if not rows:
            return rows
        found = dict(self.db.query(
            f"SELECT todo_id, available_at FROM sb_claimable WHERE todo_id IN ({', '.join(['%s'] * len(rows))})",
            [r["id"] for r in rows],
        ))
        for row in rows:
            waiting = row["state"] in WAITING
            row["available_at"] = claimable_from(row["queue"], from_micros(found.get(row["id"]))) if waiting else None
        return rows

    def queue_loads(self, endpoint_id: str, queues: Sequence[str], now: datetime) -> dict[str, tuple[int, int]]:
        """Per queue of the endpoint: claimed todos now, and claims admitted under controls in the
        last 60 s (as the write side counts them)."""
        loads = {q: (0, 0) for q in queues}
        if not queues:
            return loads
        marks = ", ".join(["%s"] * len(queues))
        for q, n in self.db.query(
            f"SELECT queue, count(*) FROM sb_in_flight WHERE endpoint_id = %s AND queue IN ({marks}) GROUP BY queue",
            (endpoint_id, *queues),
        ):
            loads[q] = (int(n), loads[q][1])
        since = micros(now - RATE_WINDOW)
        for q, n in self.db.query(
            f"SELECT queue, count(*) FROM sb_queue_claims WHERE endpoint_id = %s AND queue IN ({marks})"
            " AND claimed_at > %s GROUP BY queue", (endpoint_id, *queues, since),
        ):
            loads[q] = (loads[q][0], int(n))
        return loads

    def queue_load(self, endpoint_id: str, queue: str, now: datetime) -> QueueLoad:
        """One queue's committed load, read as admission reads it (`SqlQueueLoad.load`)."""
        return SqlQueueLoad(self.db).load(endpoint_id, queue, now)

    def waiting(self, endpoint_id: str, queue: str, now: datetime, limit: int) -> tuple[int, list[dict[str, Any]]]:
        """From the claimable queue (inline, so as fresh as the doorbell's rings): the todos
        claim_next could take from this queue now, counted, and the oldest `limit`."""
        where = ("FROM sb_claimable WHERE endpoint_id = %s AND queue = %s AND available_at IS NOT NULL"
                 " AND available_at <= %s")
        args = (endpoint_id, queue, micros(now))
        count = self.db.query(f"SELECT count(*) {where}", args)[0][0]
        rows = self.db.query(f"SELECT todo_id, title, created_at {where} ORDER BY created_at, todo_id LIMIT %s",
                             (*args, limit))
        return int(count), [{"id": t, "title": title, "created_at": iso(from_micros(at))} for t, title, at in rows]

    def dead_letter_ids(self, endpoint_id: str, queue: str | None) -> list[str]:
        """Every dead letter of the endpoint (or of one of its queues), oldest first."""
        where, params = "endpoint_id = %s AND state = 'failed' AND dead_letter = 1", [endpoint_id]
        if queue is not None:
            where += " AND queue = %s"
            params.append(queue)
        return [r[0] for r in self.db.query(
            f"SELECT todo_id FROM sb_todo_rows WHERE {where} ORDER BY created_at, todo_id", params)]

    def fault_traces(self, todo_ids: Sequence[str], endpoint_ids: Sequence[str] | None) -> dict[str, dict[str, Any]]:
        """The fault trace of each of these quarantined todos (on these endpoints) that has one."""
        if not todo_ids or (endpoint_ids is not None and not endpoint_ids):
            return {}
        where, params = f"f.todo_id IN ({', '.join(['%s'] * len(todo_ids))})", list(todo_ids)
        if endpoint_ids is not None:
            where += f" AND t.endpoint_id IN ({', '.join(['%s'] * len(endpoint_ids))})"
            params.extend(endpoint_ids)
        rows = self.db.query(
            f"SELECT f.todo_id, f.routing FROM sb_fault_traces f JOIN sb_todo_rows t ON t.todo_id = f.todo_id"
            f" WHERE {where}", params,
        )
        return {todo_id: json.loads(routing) for todo_id, routing in rows}

    def queue_counts(self, endpoint_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Per queue and state: how many, and the oldest pending todo's creation time."""
        where, params = "", []
        if endpoint_ids is not None:
            where = f" WHERE endpoint_id IN ({', '.join(['%s'] * len(endpoint_ids))})" if endpoint_ids else " WHERE 1 = 0"
            params = list(endpoint_ids)
        rows = self.db.query(queue_counts_sql(where), params)
        return [
            {"queue": q, "state": s, "dead_letter": bool(d), "count": n,
             "oldest_created_at": iso(from_micros(oldest)) if s == "pending" else None}
            for q, s, d, n, oldest in rows
        ]

    def list_endpoints(self, *, owner: str | None) -> list[dict[str, Any]]:
        where, params = ("WHERE owner = %s", (owner,)) if owner is not None else ("", ())
        rows = self.db.query(
            "SELECT endpoint_id, slug, agent, owner, queues, verbs, webhook_max, source_types, webhook_queues,"
            f" default_lease_seconds, expires_at, revoked_at, created_at FROM sb_endpoints {where}"
            " ORDER BY created_at, slug", params,
        )
        return [
            {"endpoint_id": r[0], "slug": r[1], "agent": r[2], "owner": r[3], "queues": json.loads(r[4]),
             "verbs": json.loads(r[5]), "webhook_max": r[6], "source_types": json.loads(r[7]),
             "webhook_queues": json.loads(r[8]), "default_lease_ttl_seconds": r[9],
             "expires_at": iso(from_micros(r[10])), "revoked": r[11] is not None,
             "created_at": iso(from_micros(r[12]))}
            for r in rows
        ]

    def endpoint_ids_of(self, owner: str) -> list[str]:
        self.catch_up()
        return [r[0] for r in self.db.query("SELECT endpoint_id FROM sb_endpoints WHERE owner = %s", (owner,))]

    def held_todos(self, endpoint_id: str, holder: str) -> list[str]:
        rows = self.db.query(
            "SELECT todo_id FROM sb_todo_rows WHERE endpoint_id = %s AND state = 'claimed' AND owner = %s",
            (endpoint_id, holder),
        )
        return [r[0] for r in rows]

    def due_timers(self, now: datetime, limit: int) -> list[str]:
        rows = self.db.query(
            "SELECT todo_id FROM sb_claimable WHERE due_at IS NOT NULL AND due_at <= %s ORDER BY due_at LIMIT %s",
            (micros(now), limit),
        )
        return [r[0] for r in rows]

    def next_due(self) -> datetime | None:
        (value,), = self.db.query("SELECT min(due_at) FROM sb_claimable WHERE due_at IS NOT NULL")
        return from_micros(value)

    def subject_of_credential(self, sha256: str) -> tuple[str, str] | None:
        rows = self.db.query("SELECT kind, subject_id FROM sb_credentials WHERE sha256 = %s", (sha256,))
        return (rows[0][0], rows[0][1]) if rows else None

    def operator_count(self) -> int:
        (n,), = self.db.query("SELECT count(*) FROM sb_operators")
        return n

    # -- webhooks and deliveries

    def list_webhooks(self, *, endpoint_ids: Sequence[str] | None) -> list[dict[str, Any]]:
        where, params = "WHERE w.deleted_at IS NULL", []
        if endpoint_ids is not None:
            if not endpoint_ids:
                return []
            where += f" AND w.endpoint_id IN ({', '.join(['%s'] * len(endpoint_ids))})"
            params = list(endpoint_ids)
        rows = self.db.query(
            "SELECT w.webhook_id, w.endpoint_id, w.source_type, w.target_queue, w.trust_mode, w.created_at,"
            " w.rotated_at, (SELECT count(*) FROM sb_webhook_routes r WHERE r.webhook_id = w.webhook_id),"
            " t.trusted_senders, t.trusted_associations"
            f" FROM sb_webhooks w LEFT JOIN sb_webhook_trust t ON t.webhook_id = w.webhook_id {where}"
            " ORDER BY w.created_at, w.webhook_id", params,
        )
        return [
            {"webhook_id": r[0], "endpoint_id": r[1], "source_type": r[2], "target_queue": r[3],
             "trust_mode": r[4], "created_at": iso(from_micros(r[5])), "rotated_at": iso(from_micros(r[6])),
             "routes": r[7], "trusted_senders": json.loads(r[8]) if r[8] else [],
             "trusted_associations": json.loads(r[9]) if r[9] else []}
            for r in rows
        ]

    def recent_envelopes(self, webhook_id: str, limit: int) -> list[tuple[str, str]]:
        """(event_id, envelope JSON) of a webhook's latest deliveries, newest first; each body is
        spliced in from the payload store, and a delivery whose body was pruned is left out."""
        return self._envelopes(
            self.db.query(
                f"{_ENVELOPES} WHERE d.webhook_id = %s ORDER BY d.position DESC LIMIT %s", (webhook_id, limit)
            )
        )

    def delivery_envelope(self, webhook_id: str, event_id: str) -> str | None:
        found = self._envelopes(
            self.db.query(f"{_ENVELOPES} WHERE d.webhook_id = %s AND d.event_id = %s", (webhook_id, event_id))
        )
        return found[0][1] if found else None

    @staticmethod
    def _envelopes(rows: Sequence[tuple]) -> list[tuple[str, str]]:
        found = []
        for event_id, env, form, codec, data in rows:
            if data is None:
                continue  # pruned (docs/adr/0027)
            found.append((event_id, envelope_with_payload(env, unpack(codec, data), form)))
        return found

    def prunable(self, cutoff: datetime) -> list[tuple[str, int, str]]:
        """(digest, size, holder) of every stored payload that only work finished before the cutoff
        names, and that nothing named since (docs/adr/0027)."""
        at = micros(cutoff)
        return [(r[0], int(r[1]), r[2]) for r in self.db.query(
            f"SELECT r.sha256, b.size, r.holder FROM sb_payload_refs r JOIN {PAYLOADS} b ON b.sha256 = r.sha256"
            " WHERE b.data IS NOT NULL AND b.named_at < %s AND r.sha256 IN ("
            " SELECT a.sha256 FROM sb_payload_refs a LEFT JOIN sb_payload_holders h ON h.holder = a.holder"
            " GROUP BY a.sha256"
            " HAVING SUM(CASE WHEN h.finished_at IS NOT NULL AND h.finished_at < %s THEN 0 ELSE 1 END) = 0)",
            (at, at),
        )]

    def inline_events(self, digests: Sequence[str]) -> list[str]:
        """The old events (`<id hex>:<version>`) that still hold one of these payloads inline."""
        found: list[str] = []
        for start in range(0, len(digests), 500):
            chunk = list(digests[start:start + 500])
            found += [r[0] for r in self.db.query(
                f"SELECT event_key FROM sb_inline_payloads WHERE sha256 IN ({', '.join(['%s'] * len(chunk))})", chunk)]
        return sorted(set(found))

    def payload_store_size(self) -> int:
        """Bytes the payload store takes on disk. SQLite: the database file plus its `-wal`, as `ls`
        counts them, measured after a checkpoint has folded the log into the file (so that before
        and after a prune compare the database, not what the log held). Not `page_count`: that is
        the size the file will have once checkpointed, which a VACUUM shrinks at once while the
        files grow by the copy it writes to the log."""
        if self.db.dialect == "sqlite":
            self.db.checkpoint(wait_ms=CHECKPOINT_WAIT_MS)  # busy: measured as the files are
            return self.db.file_bytes()
        return int(self.db.query(f"SELECT pg_total_relation_size('{PAYLOADS}')")[0][0])

    def give_space_back(self, *, rewritten: bool = False, reclaim: bool = False) -> dict[str, Any]:
        """VACUUM after a prune: `{vacuumed: [table…], space: "system"|"store"}` (whom the freed space
        went to). SQLite rewrites the whole database without the freed pages, then checkpoints it
        into the file and truncates the log (`checkpoint: "done"|"busy"`). PostgreSQL vacuums the
        tables the prune freed rows in — the payload store (its TOAST table with it), and the
        events and inline-payload rows a prune `rewritten` by reference — so new rows reuse that
        space; only a table's empty tail goes back to the system. `reclaim`: then `VACUUM FULL` of the payload store, which rewrites it into new files
        and gives all its free space back to the system, holding an ACCESS EXCLUSIVE lock on it
        meanwhile (every append that stores bytes and every payload read waits). It waits at most
        `RECLAIM_LOCK_WAIT_MS` for that lock — while it waits, every later user of the table queues
        behind it — and else gives up: `reclaim: "busy"`, the space stays with the store."""
        if self.db.dialect == "sqlite":
            # in WAL mode VACUUM writes the whole rewritten database into the -wal file, and the
            # database file keeps its size until a checkpoint folds it back; this one (TRUNCATE)
            # also empties the log ("busy": a reader of an older snapshot held it off)
            self.db.query("VACUUM")
            done = self.db.checkpoint(wait_ms=CHECKPOINT_WAIT_MS)
            return {"vacuumed": ["database"], "space": "system", "checkpoint": "done" if done else "busy"}
        done = []
        for table in (PAYLOADS, *(("stored_events", "sb_inline_payloads") if rewritten else ())):
            self.db.query(f"VACUUM {table}")
            done.append(table)
        if not reclaim:
            return {"vacuumed": done, "space": "store"}
        # after the plain VACUUM: a VACUUM FULL keeps every row a transaction running anywhere in
        # the cluster (another database too) might still see, the plain one only this database's
        try:
            self.db.maintain(f"VACUUM FULL {PAYLOADS}", lock_timeout_ms=RECLAIM_LOCK_WAIT_MS)
        except LockBusy:
            return {"vacuumed": done, "space": "store", "reclaim": "busy"}
        return {"vacuumed": [*done, f"{PAYLOADS} (FULL)"], "space": "system", "reclaim": "done"}

    def list_deliveries(self, *, webhook_id: str | None, endpoint_ids: Sequence[str] | None, limit: int,
                        before: int | None) -> tuple[list[dict[str, Any]], int | None]:
        """Delivery summaries newest first, and the cursor of the next page (or None)."""
        where, params = [], []
        if webhook_id is not None:
            where.append("d.webhook_id = %s")
            params.append(webhook_id)
        if endpoint_ids is not None:
            if not endpoint_ids:
                return [], None
            where.append(f"d.endpoint_id IN ({', '.join(['%s'] * len(endpoint_ids))})")
            params.extend(endpoint_ids)
        if before is not None:
            where.append("d.position < %s")
            params.append(before)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self.db.query(
            "SELECT d.event_id, d.webhook_id, d.endpoint_id, d.source, d.kind, d.trust_mode, d.verified,"
            " d.disposition, d.size, d.todo_count, d.received_at, d.position, d.routing, i.delivery_id"
            f" FROM sb_stored_deliveries d LEFT JOIN sb_delivery_ids i ON i.event_id = d.event_id{clause}"
            " ORDER BY d.position DESC LIMIT %s", (*params, limit + 1),
        )
        more = len(rows) > limit
        rows = rows[:limit]
        summaries = [
            {"id": r[0], "delivery_id": r[13], "webhook_id": r[1], "endpoint_id": r[2], "source": r[3], "kind": r[4],
             "trust_mode": r[5], "verified": bool(r[6]), "disposition": r[7], "size": r[8],
             "todos_created": r[9], "received_at": iso(from_micros(r[10])), "routing": json.loads(r[12])}
            for r in rows
        ]
        return summaries, (rows[-1][11] if more and rows else None)
