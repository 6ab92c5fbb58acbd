"""The feed under appends that would commit out of position order, on PostgreSQL.

A trigger holds one append inside its transaction (after it drew its position, before commit)
while another process appends and commits. Were positions handed out to transactions that commit
in any order, the second append's higher position would be visible first and a tailer that moved
past it would never see the first: a skipped transition. The events table's EXCLUSIVE lock makes
the second append wait, so the feed sees both, once each, in order (docs/adr/0012).
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from application.feed import TransitionFeed
from application.service import Caller

pytestmark = pytest.mark.postgres
CLI = Caller.cli()
MARKER = "hold-this-append"

TRIGGER = f"""
CREATE FUNCTION sbtest_hold_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.topic = 'TodoOpened' AND position(convert_to('{MARKER}', 'UTF8') IN NEW.state) > 0 THEN
        PERFORM pg_sleep(0.6);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sbtest_hold_append AFTER INSERT ON stored_events
    FOR EACH ROW EXECUTE FUNCTION sbtest_hold_append();
"""


def test_a_held_append_is_neither_skipped_nor_overtaken(pg_url, make_container):
    first, second = make_container(pg_url), make_container(pg_url)  # two writers, as two processes
    first.app.ensure_admin()
    vended = first.app.vend("ordering", queues=["work"], caller=CLI)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(TRIGGER)
    feed = TransitionFeed(first.store)
    start = feed.head()
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def tail() -> None:
        after = start
        while not stop.is_set():
            feed.tick()
            found, after, _ = feed.since(after, None)
            seen.extend((t["position"], t["todo_id"]) for t in found)
            time.sleep(0.005)

    held: dict[str, str] = {}
    tailer = threading.Thread(target=tail)
    tailer.start()
    holder = threading.Thread(target=lambda: held.update(
        first.app.push(vended["slug"], MARKER, caller=CLI)["todo"]))
    holder.start()
    time.sleep(0.2)  # the held append has its position and sleeps inside its transaction
    began = time.monotonic()
    overtaker = second.app.push(vended["slug"], "not held", caller=CLI)["todo"]
    waited = time.monotonic() - began
    holder.join()
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    tailer.join()

    positions = {todo_id: position for position, todo_id in seen}
    assert [todo_id for _, todo_id in seen] == [held["id"], overtaker["id"]], seen
    assert positions[held["id"]] < positions[overtaker["id"]]
    assert waited >= 0.3, waited  # the second append waited for the held one to commit
