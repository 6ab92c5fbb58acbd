"""The transition feed behind `/api/v1/stream`: every todo transition once, in log order, per owner."""

from __future__ import annotations

import threading
import time

import pytest

import application.feed
from application.feed import TransitionFeed
from application.service import Caller

from .harness import CLI, agent, mixed_workload, unique


@pytest.fixture
def feeds(sb):
    """Makes feeds on this store, each closed (its tailer ended) before the store closes."""
    made: list[TransitionFeed] = []

    def make(**options) -> TransitionFeed:
        made.append(TransitionFeed(sb.container.store, **options))
        return made[-1]

    yield make
    for feed in made:
        feed.close()


def todo_positions(sb, owner: str | None = None) -> list[tuple[int, str, str]]:
    """(position, todo id, event type) of every todo event in the log, from the audit export."""
    visible = None
    if owner is not None:
        visible = {e["endpoint_id"] for e in sb.app.list_endpoints(caller=Caller.operator(owner))}
    rows = []
    todo_endpoint: dict[str, str] = {}
    for record in sb.app.audit():
        if record["type"] == "TodoOpened":
            todo_endpoint[record["aggregate"]] = record["data"]["endpoint_id"]
        if record["aggregate"] in todo_endpoint and record["type"].startswith(("Todo", "Lease")):
            if visible is None or todo_endpoint[record["aggregate"]] in visible:
                rows.append((record["position"], record["aggregate"], record["type"]))
    return rows


def seen(found) -> list[tuple[int, str, str]]:
    return [(t["position"], t["todo_id"], t["type"]) for t in found]


def drain(feed: TransitionFeed, after: int, owner: str | None) -> tuple[list[dict], int]:
    """Everything after a position, as a follower gets it: call again while `more` says so."""
    found, more = [], True
    while more:
        page, after, more = feed.since(after, owner)
        found.extend(page)
    return found, after


def test_a_follower_from_position_zero_gets_every_transition_once_in_log_order(sb, feeds):
    mixed_workload(sb)
    feed = feeds()

    found, head = drain(feed, 0, None)

    assert seen(found) == todo_positions(sb)
    assert head == sb.container.store.max_position()
    assert [t["state"] for t in found if t["type"] == "TodoCompleted"] == ["done"] * len(
        [t for t in found if t["type"] == "TodoCompleted"])


def test_each_owner_sees_only_its_own_endpoints_transitions(sb, feeds):
    mixed_workload(sb)
    bob = next(e["owner"] for e in sb.app.list_endpoints(caller=CLI) if e["owner"] != "admin")
    feed = feeds()

    admins, _ = drain(feed, 0, "admin")
    bobs, _ = drain(feed, 0, bob)

    assert seen(admins) == todo_positions(sb, "admin")
    assert seen(bobs) == todo_positions(sb, bob)
    assert seen(admins) and seen(bobs) and not set(seen(admins)) & set(seen(bobs))


def test_resuming_after_any_position_repeats_and_skips_nothing(sb, feeds):
    feed = feeds(ring=7)  # a small ring: old positions come from the log
    follower = feed.follow()
    try:
        vended = sb.vend()
        for i in range(12):
            todo_id = sb.push(vended, f"t{i}")["id"]
            sb.app.claim(todo_id, caller=agent(vended))
            sb.app.complete(todo_id, caller=agent(vended))
        feed.tick()
        everything = seen(drain(feed, 0, None)[0])
        assert everything == todo_positions(sb)
        for cut in range(0, len(everything), 5):
            after = everything[cut][0]
            assert seen(drain(feed, after, None)[0]) == everything[cut + 1:]
    finally:
        follower.close()


def test_transitions_from_another_process_reach_the_tailer(sb, feeds):
    feed = feeds()
    start = feed.head()
    other = sb.another_process()
    vended = other.app.vend(unique("w"), queues=[unique("q")], caller=CLI)
    todo_id = other.app.push(vended["slug"], "elsewhere", caller=CLI)["todo"]["id"]

    assert feed.tick() == 1
    found, head = drain(feed, start, "admin")

    assert [(t["todo_id"], t["type"], t["state"], t["queue"]) for t in found] == [
        (todo_id, "TodoOpened", "pending", vended["queues"][0])]
    assert head == other.store.max_position()


def test_concurrent_writers_never_make_the_tailer_skip_or_repeat(sb, feeds):
    """Two containers (as two processes) append at once while the tailer reads in between."""
    feed = feeds()
    start = feed.head()
    containers = [sb.container, sb.another_process()]
    vended = sb.vend()
    stop = threading.Event()
    collected: list[dict] = []

    def tail() -> None:
        after = start
        while not stop.is_set():
            feed.tick()
            found, after = drain(feed, after, None)
            collected.extend(found)

    def write(container) -> None:
        for i in range(40):
            todo_id = container.app.push(vended["slug"], f"w{i}", caller=CLI)["todo"]["id"]
            container.app.claim(todo_id, caller=agent(vended))
            container.app.complete(todo_id, caller=agent(vended))

    tailer = threading.Thread(target=tail)
    tailer.start()
    writers = [threading.Thread(target=write, args=(c,)) for c in containers]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    feed.tick()
    stop.set()
    tailer.join()
    collected.extend(drain(feed, max([start] + [t["position"] for t in collected]), None)[0])

    expected = [row for row in todo_positions(sb) if row[0] > start]
    assert len(expected) == 2 * 40 * 3
    assert seen(collected) == expected


def test_a_follower_after_an_idle_spell_starts_at_the_present(sb, feeds):
    """Once nobody follows, the tailer stops; the next follower must not inherit a stale head."""
    feed = feeds(poll=0.01)
    vended = sb.vend()
    feed.follow().close()
    for i in range(3):  # while nobody follows
        sb.push(vended, f"unwatched {i}")
    follower = feed.follow()
    try:
        assert follower.start == sb.container.store.max_position()
        assert feed.since(follower.start, None) == ([], follower.start, False)
        todo_id = sb.push(vended, "watched")["id"]
        feed.tick()
        seen = drain(feed, follower.start, None)[0]
        deadline = time.monotonic() + 2
        while not seen and time.monotonic() < deadline:
            # the tailer thread may have ticked at the same moment with an older ceiling; our own
            # tick then gives way to it, and the tailer's next poll (10 ms) brings the transition
            time.sleep(0.01)
            seen = drain(feed, follower.start, None)[0]
        assert [t["todo_id"] for t in seen] == [todo_id]
    finally:
        follower.close()


def test_a_resume_from_far_back_comes_in_bounded_pages(sb, feeds, monkeypatch):
    monkeypatch.setattr(application.feed, "PAGE", 4)  # 4 pages of 4 events per call at most
    vended = sb.vend()
    for i in range(20):
        sb.push(vended, f"t{i}")
    feed = feeds(ring=5)
    feed.follow()
    calls, found, after, more = 0, [], 0, True
    while more:
        page, after, more = feed.since(after, None)
        found.extend(page)
        calls += 1
        assert len(page) <= 16
    assert calls >= 2
    assert seen(found) == todo_positions(sb)


def test_a_todo_opened_before_the_feed_looked_is_still_placed_and_owned(sb, feeds):
    """Resuming after a todo's opening: its endpoint and queue are read from the store."""
    vended = sb.vend()
    todo_id = sb.push(vended)["id"]
    opened_at = sb.container.store.max_position()
    sb.app.claim(todo_id, caller=agent(vended))
    feed = feeds()  # a new process: it never saw the TodoOpened

    found, _ = drain(feed, opened_at, "admin")

    assert [(t["todo_id"], t["type"], t["queue"], t["endpoint_id"]) for t in found] == [
        (todo_id, "TodoClaimed", vended["queues"][0], vended["endpoint_id"])]
    assert drain(feed, opened_at, "someone-else")[0] == []


def test_close_returns_once_the_tailer_has_ended(sb, feeds):
    """The store is closed right after the feed: a tick still reading then would run on a closed
    connection (on SQLite, a segfault of the whole process)."""
    feed = feeds(poll=0.01)
    reading, release = threading.Event(), threading.Event()
    read = feed._read

    def slow_read(after: int, stop: int | None = None):
        reading.set()
        release.wait(5)
        return read(after, stop)

    feed._read = slow_read
    follower = feed.follow()
    assert reading.wait(5)
    closer = threading.Thread(target=feed.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while a tick was still reading the store"
    release.set()
    closer.join(5)
    assert not closer.is_alive() and not feed.tailing
    follower.close()
