"""The doorbell's NOTIFY on PostgreSQL (docs/adr/0011-doorbell.md): a commit sends it only when a
scan can find something because of it, and says what — `ring` when a todo became claimable or a
queue's controls changed, `freed` when a claim ended; a claim or a heartbeat sends none."""

from __future__ import annotations

import time

import psycopg
import pytest

from domain.doorbell import FREED, RING, doorbell_news
from domain.endpoint import QueueControlsSet
from domain.todo import LeaseRenewed, TodoClaimed, TodoCompleted, TodoFailed, TodoOpened
from tests.integration._support import CLI, vend_worker

pytestmark = pytest.mark.postgres


def test_news_is_ring_before_freed_and_none_for_claims_and_heartbeats():
    def bare(cls):
        return cls.__new__(cls)

    assert doorbell_news([bare(TodoClaimed), bare(LeaseRenewed)]) is None
    assert doorbell_news([bare(TodoClaimed), bare(TodoCompleted)]) == FREED
    assert doorbell_news([bare(TodoFailed)]) == FREED
    assert doorbell_news([bare(TodoCompleted), bare(TodoOpened)]) == RING
    assert doorbell_news([bare(QueueControlsSet)]) == RING
    assert doorbell_news([]) is None


def _notices(conn: psycopg.Connection, wait: float) -> list[str]:
    """The payloads of the notices that arrive within `wait` seconds."""
    got: list[str] = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        for notice in conn.notifies(timeout=left, stop_after=1):
            got.append(notice.payload)
    return got


def test_only_commits_that_can_make_a_ring_due_notify(pg_url, make_container):
    container = make_container(pg_url)
    app = container.app
    worker = vend_worker(app)
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{container.store.recorder.channel_name}"')
        _notices(listener, 0.2)  # what setting up sent

        opened = app.push(worker.name, "one", caller=CLI, payload={"n": 1})["todo"]["id"]
        assert _notices(listener, 0.5) == [RING]

        claimed = app.claim_next(caller=worker)
        assert claimed["todo"]["id"] == opened
        app.heartbeat(opened, caller=worker)
        assert _notices(listener, 0.5) == []

        app.complete(opened, caller=worker)
        assert _notices(listener, 0.5) == [FREED]

        app.set_queue_controls(worker.name, "work", caller=CLI, paused=True)
        assert _notices(listener, 0.5) == [RING]
