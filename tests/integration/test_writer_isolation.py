"""The batching writer: a command whose events cannot be written at all (here: text that is not
Unicode, which the event codec cannot encode) fails alone, never the other commands that
happened to share its batch (docs/adr/0004-claims-and-batching.md)."""

from __future__ import annotations

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


def test_an_unwritable_command_fails_alone_in_its_batch(store_url, make_container):
    container = make_container(store_url)
    app, store = container.app, container.store
    app.ensure_admin()
    slug = app.vend("writer", queues=["q"], caller=CLI)["slug"]
    entered, release = threading.Event(), threading.Event()

    def hold_the_writer(uow):
        entered.set()
        assert release.wait(10)

    with ThreadPoolExecutor(max_workers=4) as pool:
        held = pool.submit(store.run, hold_the_writer)
        assert entered.wait(10)
        # these queue up behind the held command and so form the next batch together
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
