"""The batching writer: a command whose events cannot be written at all (here: text that is not
Unicode, which the event codec cannot encode) fails alone, never the other commands that
happened to share its batch (docs/adr/0004-claims-and-batching.md)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from uuid import uuid4

from application.service import Caller
from domain.endpoint import endpoint_uuid
from domain.todo import Todo

CLI = Caller.cli()


def unwritable_todo(slug):
    def handler(uow):
        uow.add(Todo.open(
            id=uuid4(), now=uow.now, actor="operator:cli", endpoint_id=f"ep_{endpoint_uuid(slug).hex}",
            queue="q", source="operator", title="bad", trust_mode="operator", payload={"text": "lone \ud800"},
        ))

    return handler


class HeldWriter:
    """A store with one endpoint, and a command that holds its writer until released: the
    commands sent meanwhile queue up and join the held command's batch once it is released."""

    def __init__(self, store_url, make_container, agent: str) -> None:
        container = make_container(store_url)
        self.app, self.store = container.app, container.store
        self.app.ensure_admin()
        self.slug = self.app.vend(agent, queues=["q"], caller=CLI)["slug"]
        self.entered, self.release = threading.Event(), threading.Event()

    def hold(self, uow) -> None:
        self.entered.set()
        assert self.release.wait(10)


def test_an_unwritable_command_fails_alone_in_its_batch(store_url, make_container):
    held_writer = HeldWriter(store_url, make_container, "writer")
    app, store, slug = held_writer.app, held_writer.store, held_writer.slug
    entered, release, hold_the_writer = held_writer.entered, held_writer.release, held_writer.hold
    with ThreadPoolExecutor(max_workers=4) as pool:
        held = pool.submit(store.run, hold_the_writer)
        assert entered.wait(10)
        # these queue up behind the held command and so join its batch together
        good_before = pool.submit(app.push, slug, "before", caller=CLI, payload={"n": 1})
        # the application refuses such text at the door (invalid_argument), so go round it
        bad = pool.submit(store.run, unwritable_todo(slug))
        good_after = pool.submit(app.push, slug, "after", caller=CLI, payload={"n": 2})
        deadline = time.monotonic() + 10
        while store.writer.jobs.qsize() < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert store.writer.jobs.qsize() == 3
        release.set()
        held.result(timeout=10)
        assert good_before.result(timeout=10)["created"] is True
        assert good_after.result(timeout=10)["created"] is True
        with pytest.raises(UnicodeEncodeError):
            bad.result(timeout=10)

    titles = sorted(t["title"] for t in app.list_todos(caller=CLI, endpoint=slug))
    assert titles == ["after", "before"]
    assert app.push(slug, "later", caller=CLI)["created"] is True  # the writer is fine


def test_commands_awaited_on_an_event_loop_share_a_batch_and_never_block_the_loop(store_url, make_container):
    """`run_async` (how ingest awaits its commit): the loop goes on running while the writer is
    busy; the awaited commands join the batch of a thread's, and each gets its own answer or error."""
    held_writer = HeldWriter(store_url, make_container, "writer-async")
    app, store, slug = held_writer.app, held_writer.store, held_writer.slug
    entered, release, hold_the_writer = held_writer.entered, held_writer.release, held_writer.hold

    def opened(title):
        def handler(uow):
            todo = Todo.open(id=uuid4(), now=uow.now, actor="operator:cli", endpoint_id=f"ep_{endpoint_uuid(slug).hex}",
                             queue="q", source="operator", title=title, trust_mode="operator", payload={"t": title})
            uow.add(todo)
            return todo.todo_id
        return handler

    async def main():
        loop = asyncio.get_running_loop()
        held = loop.run_in_executor(None, store.run, hold_the_writer)
        assert await loop.run_in_executor(None, entered.wait, 10)
        awaited = [asyncio.ensure_future(store.run_async(opened(f"a{i}"))) for i in range(3)]
        bad = asyncio.ensure_future(store.run_async(unwritable_todo(slug)))
        threaded = loop.run_in_executor(None, store.run, opened("t"))
        ticks = 0
        while store.writer.jobs.qsize() < 5:  # the loop runs while every one of them waits
            await asyncio.sleep(0.005)
            ticks += 1
            assert ticks < 2000
        release.set()
        await held
        ids = await asyncio.gather(*awaited, threaded)
        with pytest.raises(UnicodeEncodeError):
            await bad
        return ids

    ids = asyncio.run(main())
    assert len(set(ids)) == 4
    assert [app.get_todo(i, caller=CLI)["title"] for i in ids] == ["a0", "a1", "a2", "t"]


def test_a_taken_command_runs_while_its_batch_waits_for_more(store_url, make_container, monkeypatch):
    """The writer runs each command's handler as soon as it takes the command, while the batch
    lingers for the callers about to come back (docs/adr/0032); the batch still commits as one."""
    from interfaces.store import writer as writer_module

    held_writer = HeldWriter(store_url, make_container, "writer-linger")
    app, store, slug = held_writer.app, held_writer.store, held_writer.slug
    monkeypatch.setattr(writer_module, "LINGER", 5.0)
    monkeypatch.setattr(writer_module, "GAP", 5.0)
    store.writer._recent_sizes.append(2)  # recent batches held two: the next one waits for a second
    commits: list[list[str]] = []
    heard = threading.Event()

    def announced(recorded) -> None:  # a commit is announced after its callers are answered
        names = [type(r.event).__name__ for r in recorded]
        if "TodoOpened" in names:  # not the set-up's own commit, which may be announced after this subscribes
            commits.append(names)
            heard.set()

    store.writer.subscribe(announced)
    handled = threading.Event()

    def first(uow):
        todo = Todo.open(id=uuid4(), now=uow.now, actor="operator:cli", endpoint_id=f"ep_{endpoint_uuid(slug).hex}",
                         queue="q", source="operator", title="first", trust_mode="operator", payload={"n": 1})
        uow.add(todo)
        handled.set()
        return todo.todo_id

    with ThreadPoolExecutor(max_workers=2) as pool:
        answer = pool.submit(store.run, first)
        assert handled.wait(2.5), "the handler waited for its batch to close"
        assert not answer.done()  # its batch is still open, lingering for a second command
        second = pool.submit(app.push, slug, "second", caller=CLI, payload={"n": 2})
        first_id = answer.result(timeout=10)
        assert second.result(timeout=10)["created"] is True
    assert heard.wait(5)
    assert commits == [["TodoOpened", "TodoOpened"]]  # one commit for both
    assert app.get_todo(first_id, caller=CLI)["title"] == "first"
    assert sorted(t["title"] for t in app.list_todos(caller=CLI, endpoint=slug)) == ["first", "second"]


def test_a_filling_batch_stops_waiting_once_no_command_has_come_for_a_gap(store_url, make_container, monkeypatch):
    """The batch waits for as many commands as the recent batches held, up to LINGER in all, but
    no longer than GAP for each next one: a lone command does not wait out the whole LINGER."""
    from interfaces.store import writer as writer_module

    held_writer = HeldWriter(store_url, make_container, "writer-gap")
    app, store, slug = held_writer.app, held_writer.store, held_writer.slug
    app.push(slug, "warm", caller=CLI, payload={"n": 0})  # the writer thread and its connection up
    monkeypatch.setattr(writer_module, "LINGER", 5.0)
    monkeypatch.setattr(writer_module, "GAP", 0.05)
    store.writer._recent_sizes.extend([8] * writer_module.RECENT)  # recent batches were full
    started = time.monotonic()
    app.push(slug, "alone", caller=CLI, payload={"n": 1})
    waited = time.monotonic() - started
    assert waited < 2.5, f"a lone command waited {waited:.2f} s for its batch to fill (LINGER is 5 s)"


def test_an_outage_its_sessions_see_apart_is_one_outage_in_the_log(store_url, make_container, monkeypatch, caplog):
    """The writer thread's session and an event loop's fail and come back apart (a cluster short
    of connections lets one connect and not the other: four "writer" lines for one outage in the
    fault suite). The log says the store went once, and that it is back once commits have gone
    SETTLE s without a failure, with no command needed after them (the idle thread says it)."""
    from application import background
    from application.errors import StoreUnavailable
    from interfaces.store import writer as writer_module

    monkeypatch.setattr(background, "SETTLE", 0.3)
    monkeypatch.setattr(writer_module, "SETTLE", 0.3)
    held_writer = HeldWriter(store_url, make_container, "writer-outage")
    app, store, slug = held_writer.app, held_writer.store, held_writer.slug
    writer = store.writer
    assert app.push(slug, "before", caller=CLI)["created"] is True  # the thread runs, then waits for jobs
    caplog.set_level("WARNING", logger="switchboard.store")
    too_many = StoreUnavailable('FATAL: too many connections for role "sb"')
    # as the loop's batches report, from another thread than the writer's
    for _ in range(3):
        writer.store_down(too_many)
        assert writer.down  # each failure still answers 503 at once
        writer._store_up()
        assert not writer.down
    time.sleep(1.0)  # idle: no command after the last commit
    assert [r.getMessage() for r in caplog.records] == [
        'writer: store unavailable (FATAL: too many connections for role "sb"); commands are answered 503 until'
        " it is back",
        "writer: store is back",
    ]
    assert app.push(slug, "after", caller=CLI)["created"] is True
    assert len(caplog.records) == 2
