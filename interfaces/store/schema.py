"""The store's tables: the library's, the tracking and ring tables, each projection's; how
their large columns are compressed. Idempotent and safe with several processes opening at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg

from domain.names import TODO_PREFIX, parse_id, uuid_of_hex
from interfaces.store import blobs
from interfaces.store.database import Database, LockBusy, Tx
from interfaces.store.queues import REFUSALS_DDL
from interfaces.store.read_checks import STALE_READS_DDL
from interfaces.store.chain import CHAIN_DDL
from interfaces.store.lanes import CLAIMERS_DDL
from interfaces.store.rings import RINGS_DDL
from projections import claimable, deliveries
from projections.base import Projection, Tracking

log = logging.getLogger("switchboard.store")

LZ4_COLUMNS = (("sb_stored_deliveries", "envelope"), (blobs.TABLE, "data"))
COMPRESSION_LOCK_TIMEOUT_MS = 1000
CREATE_LOCK = 715517
"""The advisory lock PostgreSQL processes take while creating the tables."""


def create_postgres(tx: Tx, recorder: Any, projections: Sequence[Projection], decode: Any) -> None:
    """Every table on PostgreSQL, in one transaction under `CREATE_LOCK`."""
    tx.execute(f"SELECT pg_advisory_xact_lock({CREATE_LOCK})")
    # the library's create_table() on this transaction's connection, not a second one
    # from the pool (a pool of one would wait for itself)
    for statement in recorder.sql_create_statements:
        _create(tx, statement)
    # lz4 compresses event bodies several times faster than the default pglz. Only
    # when not yet set, and before any projection DDL: ALTER takes the events table's
    # strongest lock, and taking it while holding a projection table's lock would
    # deadlock with a running server's append (events table first, then projections).
    _use_lz4(tx, "stored_events", "state")
    migrate(tx, projections, dialect="postgres", decode=decode)


RETIRED = (*deliveries.RETIRED, *claimable.RETIRED)
"""Tracking rows of projections replaced by others."""


def migrate(tx: Any, projections: Sequence[Projection], *, dialect: str, decode: Any) -> None:
    """Our own tables (tracking, rings, claim lanes, the payload store, each projection's) and a
    tracking row per projection (none for a projection retired). `decode` is the event codec's
    (`merge_live_tables` reads what a ring says from the log)."""
    merge_live_tables(tx, dialect=dialect, decode=decode)  # first: it may take the events table's lock (see there)
    lanes = CLAIMERS_DDL if dialect == "postgres" else ()
    for statement in (*Tracking.DDL, *RINGS_DDL, *lanes, *CHAIN_DDL, *REFUSALS_DDL, *STALE_READS_DDL,
                      *blobs.DDL[dialect]):
        tx.execute(statement)
    tx.execute(f"DELETE FROM sb_tracking WHERE name IN ({', '.join(['%s'] * len(RETIRED))})", RETIRED)
    for projection in projections:
        for statement in projection.ddl:
            tx.execute(statement)
        tx.execute(
            "INSERT INTO sb_tracking (name, position) VALUES (%s, 0) ON CONFLICT (name) DO NOTHING",
            (projection.name,),
        )


def compress_read_models(db: Database) -> None:
    """lz4 for the large read-model columns too (the deliveries' rule envelopes): PostgreSQL's
    default pglz took ~190 µs per 11 KB envelope, lz4 ~60 (measured). Once per database: each
    in a transaction of its own, holding no other lock, so it can only wait for a running
    catch-up, never deadlock with it. While it waits, it queues ahead of the table's other
    users, so it waits at most a second; then this open leaves it to the next one."""
    for table, column in LZ4_COLUMNS:
        try:
            with db.transaction(lock_timeout_ms=COMPRESSION_LOCK_TIMEOUT_MS) as tx:
                _use_lz4(tx, table, column)
        except LockBusy:
            log.warning("%s.%s keeps its compression until the next start (table busy)", table, column)


def _create(tx: Tx, statement: Any) -> None:
    """One of the library's DDL statements; a type that exists is kept (CREATE TYPE has no IF NOT
    EXISTS: the library runs it in a transaction of its own, here a savepoint)."""
    if "CREATE TYPE" not in statement.as_string():
        tx.execute(statement)
        return
    tx.execute("SAVEPOINT sb_create_type")
    try:
        tx.execute(statement)
    except psycopg.errors.DuplicateObject:
        tx.execute("ROLLBACK TO SAVEPOINT sb_create_type")
    else:
        tx.execute("RELEASE SAVEPOINT sb_create_type")


def _use_lz4(tx: Tx, table: str, column: str) -> None:
    """Compresses the column with lz4 from now on, when this server has lz4 and it is not yet set
    (the ALTER takes the table's strongest lock: never taken when there is nothing to change)."""
    if tx.execute(
        "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
    ) and not tx.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s AND attcompression = 'l'",
        (table, column),
    ):
        tx.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


LIVE_COLUMNS = (("source", "TEXT"), ("kind", "TEXT"), ("title", "TEXT"), ("spell", "BIGINT"),
                ("pending_since", "BIGINT"), ("due_at", "BIGINT"))
"""The columns `sb_claimable` took in from `sb_doorbell` and `sb_timers` (docs/adr/0036)."""
_MERGED = {"sb_doorbell": ("source", "kind", "title", "spell", "pending_since"), "sb_timers": ("due_at",)}
_TOMBSTONE = "CREATE VIEW {name} AS SELECT 'replaced by sb_claimable (docs/adr/0036)' AS moved WHERE 1 = 0"
"""What stands in each merged table's place: a build before ADR 36 cannot index a view, so it stops
at its first open of this store instead of writing tables nobody reads; nothing can write it."""


def merge_live_tables(tx: Any, *, dialect: str, decode: Any) -> None:
    """A store made before docs/adr/0036 keeps the doorbell's pending spells in `sb_doorbell` and
    the due timers in `sb_timers`, keyed like `sb_claimable`: their columns move into its rows and
    the two tables are dropped, a view standing in each one's place (`_TOMBSTONE`). A row without a
    doorbell row (a quarantined todo, or one from before the doorbell existed) takes what a ring
    says from its `TodoOpened` in the log (`decode`: the event codec's); its spell stays null.
    Once, in the opening transaction, before any read model's DDL: on PostgreSQL under the events
    table's lock, taken before any read model's as an append takes it, so an append of a process
    still running the build before waits for the move and then fails on the dropped tables (the
    upgrade wants every process on it)."""
    old = [table for table in _MERGED if _relation(tx, table, dialect) == "table"]
    if old:
        if dialect == "postgres":
            tx.execute("LOCK TABLE stored_events IN EXCLUSIVE MODE")
        if _relation(tx, "sb_claimable", dialect) == "table":
            _move_into_claimable(tx, old, dialect)
            _ring_text_from_the_log(tx, decode, dialect)
        for table in old:
            tx.execute(f"DROP TABLE {table}")
        log.info("store: the doorbell's spells and the due timers moved into sb_claimable (docs/adr/0036)")
    for table in _MERGED:
        if _relation(tx, table, dialect) is None:
            tx.execute(_TOMBSTONE.format(name=table))


def _move_into_claimable(tx: Any, old: list[str], dialect: str) -> None:
    have = _columns(tx, "sb_claimable", dialect)
    for column, kind in LIVE_COLUMNS:
        if column not in have:
            tx.execute(f"ALTER TABLE sb_claimable ADD COLUMN {column} {kind}")
    for table in old:
        columns = _MERGED[table]
        if dialect == "postgres":  # one join, not a sub-select per row and column, under the events' lock
            sets = ", ".join(f"{c} = o.{c}" for c in columns)
            tx.execute(f"UPDATE sb_claimable SET {sets} FROM {table} o WHERE o.todo_id = sb_claimable.todo_id")
        else:
            sets = ", ".join(f"{c} = (SELECT o.{c} FROM {table} o WHERE o.todo_id = sb_claimable.todo_id)"
                             for c in columns)
            tx.execute(f"UPDATE sb_claimable SET {sets} WHERE todo_id IN (SELECT todo_id FROM {table})")


def _ring_text_from_the_log(tx: Any, decode: Any, dialect: str) -> None:
    """`source`, `kind` and `title` of the rows the doorbell had none for, from their `TodoOpened`
    (as the projection writes them), a page of todos at a time."""
    wanted = [row[0] for row in tx.execute("SELECT todo_id FROM sb_claimable WHERE title IS NULL")]
    for start in range(0, len(wanted), 500):
        ids = {uuid: todo_id for todo_id in wanted[start:start + 500] if (uuid := parse_id(TODO_PREFIX, todo_id))}
        if not ids:
            continue
        marks = ", ".join(["%s"] * len(ids))
        rows = tx.execute(
            f"SELECT originator_id, originator_version, topic, state FROM stored_events WHERE topic = 'TodoOpened'"
            f" AND originator_id IN ({marks})", [i.hex if dialect == "sqlite" else i for i in ids],
            binary=dialect != "sqlite")
        for originator, version, topic, state in rows:
            key = originator if isinstance(originator, UUID) else uuid_of_hex(originator)
            opened = decode(topic, key, version, bytes(state))
            tx.execute("UPDATE sb_claimable SET source = %s, kind = %s, title = %s WHERE todo_id = %s",
                       (opened.source, opened.kind, opened.title, ids[key]))


def _relation(tx: Any, name: str, dialect: str) -> str | None:
    """'table', 'view' or None."""
    if dialect == "sqlite":
        rows = tx.execute("SELECT type FROM sqlite_master WHERE name = %s AND type IN ('table', 'view')", (name,))
        return rows[0][0] if rows else None
    rows = tx.execute(
        "SELECT CASE c.relkind WHEN 'v' THEN 'view' ELSE 'table' END FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname = %s"
        " AND c.relkind IN ('r', 'p', 'v')", (name,))
    return rows[0][0] if rows else None


def _columns(tx: Any, table: str, dialect: str) -> set[str]:
    if dialect == "sqlite":
        return {row[1] for row in tx.execute(f"PRAGMA table_info({table})")}
    return {row[0] for row in tx.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = %s", (table,))}
