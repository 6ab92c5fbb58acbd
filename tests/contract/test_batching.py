"""Group commit: commands that share one write batch still answer each with its own outcome.

The store runs every command waiting at a moment in one transaction (interfaces/store/
eventstore.py). To put several commands into one batch deterministically, the writer is held
busy by a command that waits on a gate while the others queue up behind it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from domain.errors import Conflict

from .harness import CLI, agent


class Batch:
    def __init__(self, store) -> None:
        self._store = store
        self._threads: list[threading.Thread] = []
        self.answers: list[Any] = []

    def queue(self, call: Callable[[], Any]) -> None:
        """Starts the call and waits until its command is queued behind the held writer."""
        index = len(self.answers)
        self.answers.append(None)
        before = self._store.writer.jobs.qsize()  # the writer's queue: the only way to know it is queued

        def run() -> None:
            try:
                self.answers[index] = call()
            except Exception as error:  # noqa: BLE001 - the test inspects it
                self.answers[index] = error

        thread = threading.Thread(target=run)
        thread.start()
        self._threads.append(thread)
        deadline = time.monotonic() + 10
        while self._store.writer.jobs.qsize() == before:
            assert time.monotonic() < deadline, "the command never reached the writer"
            time.sleep(0.001)


@contextmanager
def one_batch(sb):
    """Commands queued inside the block are committed together when it ends."""
    store = sb.container.store
    started, gate = threading.Event(), threading.Event()

    def hold(uow):
        started.set()
        gate.wait(10)

    holder = threading.Thread(target=store.run, args=(hold,))
    holder.start()
    assert started.wait(10)
    batch = Batch(store)
    try:
        yield batch
    finally:
        gate.set()
        holder.join()
        for thread in batch._threads:
            thread.join()


def test_each_command_of_a_batch_answers_with_the_state_it_left(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)["id"]
    sb.app.claim(todo, caller=agent(vended))

    with one_batch(sb) as batch:
        batch.queue(lambda: sb.app.heartbeat(todo, caller=agent(vended), lease_ttl_seconds=600))
        batch.queue(lambda: sb.app.complete(todo, caller=agent(vended), summary="done"))
        batch.queue(lambda: sb.app.release(todo, caller=agent(vended)))  # refused: done by now

    beat, done, refused = batch.answers
    assert (beat["state"], beat["lease_expires_at"]) == ("claimed", "2026-01-01T00:10:00Z")
    assert (done["state"], done["lease_expires_at"]) == ("done", None)
    assert isinstance(refused, Conflict)
    events = [e["type"] for e in sb.app.history(todo, caller=CLI)["events"]]
    assert events == ["TodoOpened", "TodoClaimed", "LeaseRenewed", "TodoCompleted"]


def test_claims_batched_together_take_different_todos(sb):
    vended = sb.vend("worker")
    pushed = []
    for _ in range(3):
        pushed.append(sb.push(vended)["id"])
        sb.tick()

    with one_batch(sb) as batch:
        for _ in range(4):
            batch.queue(lambda: sb.app.claim_next(caller=agent(vended)))

    claimed = [a["todo"]["id"] for a in batch.answers if not a["empty"]]
    assert claimed == pushed
    assert batch.answers[-1] == {"empty": True}
    assert all(a["todo"]["state"] == "claimed" for a in batch.answers[:3])


def test_a_refused_command_in_a_batch_does_not_undo_the_others(sb):
    vended = sb.vend("worker")
    todo = sb.push(vended)["id"]
    sb.app.claim(todo, caller=agent(vended))

    with one_batch(sb) as batch:
        batch.queue(lambda: sb.app.heartbeat(todo, caller=agent(vended), lease_ttl_seconds=600))
        batch.queue(lambda: sb.app.release(todo, caller=CLI))  # refused: not the holder
        batch.queue(lambda: sb.app.complete(todo, caller=agent(vended), summary="done"))

    beat, refused, done = batch.answers
    assert (beat["state"], beat["lease_expires_at"]) == ("claimed", "2026-01-01T00:10:00Z")
    assert isinstance(refused, Conflict)
    assert done["state"] == "done"
    events = [e["type"] for e in sb.app.history(todo, caller=CLI)["events"]]
    assert events == ["TodoOpened", "TodoClaimed", "LeaseRenewed", "TodoCompleted"]


def test_claims_batched_together_look_at_each_todo_once(sb, monkeypatch):
    """A claim is not offered the todos an earlier claim of its batch took: eight claims of ten in
    one batch used to read 0, 10, … 70 taken todos again each (docs/adr/0023)."""
    from domain.todo import Todo
    from interfaces.store.unit import Unit

    vended = sb.vend("worker")
    pushed = []
    for _ in range(6):
        pushed.append(sb.push(vended)["id"])
        sb.tick()
    looked: list = []
    original = Unit.get

    def get(self, cls, aggregate_id, *, fresh=False):
        if cls is Todo:
            looked.append(aggregate_id)
        return original(self, cls, aggregate_id, fresh=fresh)

    monkeypatch.setattr(Unit, "get", get)
    with one_batch(sb) as batch:
        for _ in range(3):
            batch.queue(lambda: sb.app.claim_next(caller=agent(vended), max_todos=2))

    assert [t["id"] for a in batch.answers for t in a["todos"]] == pushed
    assert len(looked) == len(set(looked)) == 6, looked
