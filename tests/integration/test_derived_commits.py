"""Transactions of derived data commit without waiting for the WAL flush; a lock timeout asked
for is a LockBusy, any other lock failure a StoreUnavailable (docs/adr/0013)."""

from __future__ import annotations

import psycopg
import pytest

from application.errors import StoreUnavailable
from interfaces.store.database import Database, DatabaseUrl, LockBusy

pytestmark = pytest.mark.postgres


@pytest.fixture
def db(pg_url):
    database = Database(DatabaseUrl.parse(pg_url))
    database.open()
    yield database
    database.close()


def test_only_a_derived_transaction_skips_the_wait_for_its_wal_flush(db):
    with db.transaction(derived=True) as tx:
        assert tx.execute("SHOW synchronous_commit") == [("off",)]
    with db.transaction() as tx:
        assert tx.execute("SHOW synchronous_commit") == [("on",)]


def test_the_catch_up_commits_as_derived(db, pg_url, make_container, monkeypatch):
    container = make_container(pg_url)
    seen: list[bool] = []
    real = container.store.db.transaction

    def spy(**options):
        seen.append(options.get("derived", False))
        return real(**options)

    monkeypatch.setattr(container.store.db, "transaction", spy)
    container.app.ensure_admin()
    container.projector.catch_up()
    assert seen and all(seen)


def test_a_lock_not_granted_in_the_time_asked_is_lock_busy_and_otherwise_store_unavailable(db, pg_url):
    with db.transaction() as tx:
        tx.execute("CREATE TABLE held (x INTEGER)")
    with psycopg.connect(pg_url) as holder:
        holder.execute("LOCK TABLE held IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(LockBusy):
            with db.transaction(lock_timeout_ms=100) as tx:
                tx.execute("SELECT * FROM held")
        with pytest.raises(StoreUnavailable) as refused:
            with db.transaction() as tx:
                tx.execute("SET LOCAL lock_timeout = 100")
                tx.execute("SELECT * FROM held")
        assert not isinstance(refused.value, LockBusy)
