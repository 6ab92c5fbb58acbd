"""The store's tables: the library's, the tracking and ring tables, each projection's; how
their large columns are compressed. Idempotent and safe with several processes opening at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from interfaces.store import blobs
from interfaces.store.database import Database, LockBusy, Tx
from interfaces.store.queues import REFUSALS_DDL
from interfaces.store.read_checks import STALE_READS_DDL
from interfaces.store.chain import CHAIN_DDL
from interfaces.store.lanes import CLAIMERS_DDL
from interfaces.store.rings import RINGS_DDL
from projections.base import Projection, Tracking
from projections.deliveries import RETIRED

log = logging.getLogger("switchboard.store")

LZ4_COLUMNS = (("sb_stored_deliveries", "envelope"), (blobs.TABLE, "data"))
COMPRESSION_LOCK_TIMEOUT_MS = 1000
CREATE_LOCK = 715517
"""The advisory lock PostgreSQL processes take while creating the tables."""


def create_postgres(tx: Tx, recorder: Any, projections: Sequence[Projection]) -> None:
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
    migrate(tx, projections, dialect="postgres")


def migrate(tx: Any, projections: Sequence[Projection], *, dialect: str) -> None:
    """Our own tables (tracking, rings, claim lanes, the payload store, each projection's) and a
    tracking row per projection (none for a projection retired)."""
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
