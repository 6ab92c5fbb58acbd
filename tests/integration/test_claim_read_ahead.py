"""Claim candidates read ahead (interfaces/store/candidates.py, docs/adr/0004): a read started
after a batch that claimed serves a later claim even when batches that claimed nothing came
between (with `claim_next(max=10)`, nine commands in ten are completions), so that claim does not
query on the writer thread. It is dropped once a batch may make a todo claimable, or once it is
older than `MAX_AGE`; the claims it serves still go oldest first."""

from __future__ import annotations

import threading

import pytest

from application.service import Caller
from interfaces.store import candidates
from interfaces.store.candidates import MAX_AGE
from tests.doubles import ManualClock

CLI = Caller.cli()
WRITER = "switchboard-writer"


class ReadsOnTheWriter:
    """Which threads queried the claimable todos (the store's own query, spied on, not replaced)."""

    def __init__(self, store) -> None:
        self.threads: list[str] = []
        read = store.db.indexed_column

        def spy(sql, *args, **kwargs):
            if "sb_claimable" in sql:
                self.threads.append(threading.current_thread().name)
            return read(sql, *args, **kwargs)

        store.db.indexed_column = spy

    def on_writer(self) -> int:
        count = sum(1 for name in self.threads if name == WRITER)
        self.threads.clear()
        return count


@pytest.fixture
def queue(store_url, make_container, monkeypatch):
    # a read ahead not finished within PREFETCH_WAIT is read again on the writer: on a loaded
    # machine that may happen, and it is not what these tests are about
    monkeypatch.setattr(candidates, "PREFETCH_WAIT", 10.0)
    clock = ManualClock()
    container = make_container(store_url, clock=clock)
    app = container.app
    app.ensure_admin()
    slug = app.vend("reader", queues=["work"], caller=CLI)["slug"]
    titles = []
    for n in range(80):  # more than one read ahead holds (64): none of them reaches the queue's tail
        clock.advance(seconds=1)
        app.push(slug, f"todo {n:02d}", caller=CLI)
        titles.append(f"todo {n:02d}")
    return app, app.endpoint_caller(slug), clock, ReadsOnTheWriter(container.store), titles


def claim(app, agent, count: int) -> list[dict]:
    return app.claim_next(caller=agent, max_todos=count)["todos"]


def test_a_read_ahead_outlives_the_batches_that_claim_nothing(queue):
    app, agent, clock, reads, titles = queue
    first = claim(app, agent, 2)
    assert [t["title"] for t in first] == titles[:2]
    reads.on_writer()
    app.complete(first[0]["id"], caller=agent)  # a batch that claims nothing, between two claims
    app.heartbeat(first[1]["id"], caller=agent)
    second = claim(app, agent, 3)
    assert [t["title"] for t in second] == titles[2:5]  # oldest first, none given twice
    assert reads.on_writer() == 0, "the claim read its candidates on the writer thread"
    third = claim(app, agent, 2)  # the read after the second claim
    assert [t["title"] for t in third] == titles[5:7]
    assert reads.on_writer() == 0


def test_a_todo_that_may_become_claimable_drops_the_read_ahead(queue):
    app, agent, clock, reads, titles = queue
    first = claim(app, agent, 2)
    app.fail(first[0]["id"], caller=agent)  # claimable again once its backoff ends
    reads.on_writer()
    second = claim(app, agent, 2)
    assert [t["title"] for t in second] == titles[2:4]
    assert reads.on_writer() == 1  # read afresh, on the writer


@pytest.mark.parametrize("step", [MAX_AGE.total_seconds() * 2, -1.0], ids=["older", "clock-went-back"])
def test_a_read_ahead_older_than_its_max_age_is_read_again(queue, step):
    app, agent, clock, reads, titles = queue
    claim(app, agent, 1)
    reads.on_writer()
    clock.advance(seconds=step)
    second = claim(app, agent, 1)
    assert [t["title"] for t in second] == titles[1:2]
    assert reads.on_writer() == 1
