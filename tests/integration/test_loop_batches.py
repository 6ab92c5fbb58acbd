"""Batches committed from the event loop (docs/adr/0034): a command awaited on a loop and decided
on its caller's copies (how ingest runs, ADR 31) is handled, appended and answered on that loop,
on a session of its own; whatever is not plain goes to the writer thread, which has every rule
for it. On SQLite every command is the thread's."""

from __future__ import annotations

import asyncio
import threading
import time
from uuid import uuid4

import pytest

from application.service import Caller
from domain.endpoint import endpoint_uuid
from domain.todo import Todo

CLI = Caller.cli()


class Counted:
    """Counts the writer thread's batches and the loop's appends of one store."""

    def __init__(self, store) -> None:
        writer = store.writer
        self.thread_batches = 0
        self.loop_appends = 0
        finish, appends = writer._finish, writer._loop_appends

        def counted_finish(run, attempt):
            self.thread_batches += 1
            return finish(run, attempt)

        writer._finish = counted_finish
        if appends is not None:
            send = appends.send

            def counted_send(session, events, read):
                self.loop_appends += 1
                return send(session, events, read)

            writer._loop_appends = type(appends)(appends.open_session, counted_send)


def opened(slug: str, todo_id=None, title: str = "t"):
    """A command that opens a todo, unless one with that id exists (read from wherever the unit reads)."""
    todo_id = todo_id or uuid4()

    def handler(uow):
        if uow.get(Todo, todo_id) is not None:
            return "exists"
        todo = Todo.open(id=todo_id, now=uow.now, actor="operator:cli", endpoint_id=f"ep_{endpoint_uuid(slug).hex}",
                         queue="q", source="operator", title=title, trust_mode="operator", payload={"t": title})
        uow.add(todo)
        return todo.todo_id
    return handler


def setup(make_container, url):
    container = make_container(url)
    container.app.ensure_admin()
    slug = container.app.vend(f"loop-{uuid4().hex[:6]}", queues=["q"], caller=CLI)["slug"]
    return container, slug


async def warm(store, slug) -> None:
    """The loop's first command goes to the thread while its session opens on a thread."""
    await store.run_async(opened(slug), hints={uuid4(): None})
    deadline = time.monotonic() + 10
    while store.writer._on_loops[asyncio.get_running_loop()]._session is None:
        assert time.monotonic() < deadline, "the loop's session never opened"
        await asyncio.sleep(0.01)


@pytest.mark.postgres
def test_commands_decided_on_copies_commit_from_the_loop_together(pg_url, make_container):
    container, slug = setup(make_container, pg_url)
    store = container.store
    counted = Counted(store)

    async def main():
        await warm(store, slug)
        before = counted.thread_batches
        fresh = [uuid4() for _ in range(6)]  # each known absent by its caller: nothing to read
        ids = await asyncio.gather(*(store.run_async(opened(slug, todo_id, f"l{i}"), hints={todo_id: None})
                                     for i, todo_id in enumerate(fresh)))
        return ids, counted.thread_batches - before

    ids, thread_batches = asyncio.run(main())
    assert thread_batches == 0  # none of them went through the writer thread
    assert counted.loop_appends == 1  # submitted in one turn of the loop: one batch, one commit
    assert [container.app.get_todo(i, caller=CLI)["title"] for i in ids] == [f"l{i}" for i in range(6)]


@pytest.mark.postgres
def test_a_command_that_would_read_the_store_goes_to_the_writer_thread(pg_url, make_container):
    container, slug = setup(make_container, pg_url)
    store = container.store
    counted = Counted(store)

    async def main():
        await warm(store, slug)
        before = (counted.thread_batches, counted.loop_appends)
        # its copies say nothing of the todo it looks for, nor does the cache: a read
        todo_id = uuid4()
        answer = await store.run_async(opened(slug, todo_id), hints={uuid4(): None})
        return todo_id, answer, before

    todo_id, answer, (thread_before, loop_before) = asyncio.run(main())
    assert counted.thread_batches == thread_before + 1 and counted.loop_appends == loop_before
    assert container.app.get_todo(answer, caller=CLI)["state"] == "pending"


@pytest.mark.postgres
def test_a_loop_batch_decided_on_a_stale_copy_is_run_again_on_fresh_state_by_the_thread(pg_url, make_container):
    container, slug = setup(make_container, pg_url)
    store = container.store
    counted = Counted(store)
    todo_id = uuid4()
    first = store.run(opened(slug, todo_id, "first"))  # stored, though the copy below says absent

    async def main():
        await warm(store, slug)
        before = (counted.thread_batches, counted.loop_appends)
        store.cache.forget([todo_id])
        answer = await store.run_async(opened(slug, todo_id, "second"), hints={todo_id: None})
        return answer, before

    answer, (thread_before, loop_before) = asyncio.run(main())
    assert answer == "exists"  # decided again on what the store holds
    assert counted.loop_appends == loop_before + 1  # the loop's append lost the race...
    assert counted.thread_batches > thread_before  # ...and the thread ran it again
    assert container.app.get_todo(first, caller=CLI)["title"] == "first"


def test_on_sqlite_every_awaited_command_is_the_writer_threads(sqlite_url, make_container):
    container, slug = setup(make_container, sqlite_url)
    store = container.store
    counted = Counted(store)

    async def main():
        return await asyncio.gather(*(store.run_async(opened(slug), hints={uuid4(): None}) for _ in range(3)))

    ids = asyncio.run(main())
    assert counted.loop_appends == 0 and counted.thread_batches >= 1 and not store.writer._on_loops
    assert all(container.app.get_todo(i, caller=CLI)["state"] == "pending" for i in ids)


@pytest.mark.postgres
def test_a_large_batch_waiting_for_the_log_lock_never_blocks_the_loop(pg_url, make_container):
    """The server reads nothing more of a session waiting for the table lock, so an append larger
    than the socket's buffers cannot all be sent: the loop hands it over as the socket takes it."""
    import psycopg

    container, slug = setup(make_container, pg_url)
    store = container.store
    big = "x" * (8 * 1024 * 1024)  # far more than a socket buffers

    def opened_big(todo_id):
        def handler(uow):
            todo = Todo.open(id=todo_id, now=uow.now, actor="operator:cli", endpoint_id=f"ep_{endpoint_uuid(slug).hex}",
                             queue="q", source="operator", title="big", trust_mode="operator", payload={"big": big})
            uow.add(todo)
            return todo.todo_id
        return handler

    locked, hold_for = threading.Event(), 0.8

    def hold_the_lock():  # a thread: with a blocked loop, the test still ends (and fails)
        with psycopg.connect(pg_url) as holder:
            holder.execute("LOCK TABLE stored_events IN EXCLUSIVE MODE")
            locked.set()
            time.sleep(hold_for)

    async def main():
        loop = asyncio.get_running_loop()
        await warm(store, slug)
        holding = loop.run_in_executor(None, hold_the_lock)
        assert await loop.run_in_executor(None, locked.wait, 10)
        todo_id = uuid4()
        started = time.monotonic()
        awaited = asyncio.ensure_future(store.run_async(opened_big(todo_id), hints={todo_id: None}))
        ticks = 0
        while not awaited.done() and time.monotonic() - started < hold_for - 0.2:
            await asyncio.sleep(0.01)
            ticks += 1
        await holding
        return ticks, await asyncio.wait_for(awaited, 30)

    ticks, answer = asyncio.run(main())
    assert ticks >= 20, ticks  # the loop ran on while its batch waited for the lock (a blocked loop: 1)
    assert container.app.get_todo(answer, caller=CLI)["title"] == "big"


@pytest.mark.postgres
def test_commands_that_come_while_a_batch_is_on_its_way_are_decided_before_its_answer(pg_url, make_container):
    """The loop would only wait for the batch's answer: the handlers of the commands that come
    meanwhile run at once, and they go as the next batch the moment that answer comes."""
    import psycopg

    container, slug = setup(make_container, pg_url)
    store = container.store
    counted = Counted(store)
    decided: list[str] = []

    def noted(todo_id, title):
        handler = opened(slug, todo_id, title)

        def run(uow):
            decided.append(title)
            return handler(uow)
        return run

    locked, release = threading.Event(), threading.Event()

    def hold_the_lock():
        with psycopg.connect(pg_url) as holder:
            holder.execute("LOCK TABLE stored_events IN EXCLUSIVE MODE")
            locked.set()
            release.wait(10)

    async def main():
        loop = asyncio.get_running_loop()
        await warm(store, slug)
        before = (counted.thread_batches, counted.loop_appends)
        holding = loop.run_in_executor(None, hold_the_lock)
        assert await loop.run_in_executor(None, locked.wait, 10)
        first_id = uuid4()
        first = asyncio.ensure_future(store.run_async(noted(first_id, "first"), hints={first_id: None}))
        await asyncio.sleep(0.1)  # sent, and waiting for the lock
        later = [uuid4() for _ in range(3)]
        rest = [asyncio.ensure_future(store.run_async(noted(todo_id, f"later-{i}"), hints={todo_id: None}))
                for i, todo_id in enumerate(later)]
        await asyncio.sleep(0.1)
        seen = (list(decided), first.done())
        release.set()
        await holding
        ids = await asyncio.wait_for(asyncio.gather(first, *rest), 30)
        return seen, ids, before

    (seen, first_done), ids, (thread_before, loop_before) = asyncio.run(main())
    assert not first_done
    assert seen == ["first", "later-0", "later-1", "later-2"]  # decided while the first waited
    assert counted.loop_appends == loop_before + 2 and counted.thread_batches == thread_before
    assert [container.app.get_todo(i, caller=CLI)["title"] for i in ids] == ["first"] + [f"later-{i}" for i in range(3)]
