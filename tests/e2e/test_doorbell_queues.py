"""The doorbell under queue controls and delays (CONTRACT §13): no ring for a queue that cannot
admit, a ring when it can; a delayed or snoozed todo rung when due, never before; ring on attach
for the oldest waiting todo of a queue that can admit, never a paused queue's, a full queue's, a
held one (an untrusted sender's, in quarantine) or one not due yet.

In-process server on SQLite with the real clock, the background scheduler running, and the
official `mcp` client in its default mode.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import anyio
import anyio.to_thread
import pytest

from application.service import Caller
from interfaces.bootstrap import Background
from tests.doubles import ManualClock
from tests.e2e.test_doorbell import RING_WAIT, ids, rings_of, streaming
from tests.e2e.test_mcp_sessions import ChannelListener, InProcess, connect

CLI = Caller.cli()
QUIET = 0.8  # longer than the doorbell's poll (0.5 s): a ring that was going to come has come


@pytest.fixture
def server(tmp_path) -> Iterator[InProcess]:
    running = InProcess(tmp_path).start()
    background = Background(running.container).start()  # the scheduler fires delays
    try:
        yield running
    finally:
        background.close()
        running.stop()


def vend(inproc: InProcess, queues=("work",)) -> dict:
    return inproc.container.app.vend("alpha", queues=list(queues), caller=CLI)


def setting(inproc: InProcess):
    """An endpoint with queue `work`, the application, the endpoint as a caller, and a listener."""
    endpoint = vend(inproc)
    return endpoint, inproc.container.app, Caller("endpoint", endpoint["slug"]), ChannelListener()


async def call(fn, *args, **kwargs):
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def test_a_paused_queue_is_not_rung_and_its_oldest_todo_is_rung_on_resume(server):
    endpoint = vend(server)
    app = server.container.app
    listener = ChannelListener()

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await streaming(server, endpoint)
            await call(app.set_queue_controls, endpoint["slug"], "work", caller=CLI, paused=True)
            await anyio.sleep(QUIET)  # the doorbell has seen the queue paused
            first = (await call(app.push, endpoint["slug"], "first", caller=CLI))["todo"]["id"]
            second = (await call(app.push, endpoint["slug"], "second", caller=CLI))["todo"]["id"]
            await anyio.sleep(QUIET)
            assert listener.received == []

            # resumed within their first ring's minute: each waiting todo is rung now, once
            await call(app.set_queue_controls, endpoint["slug"], "work", caller=CLI, paused=False)
            await rings_of(listener, total=2)
            await anyio.sleep(QUIET)
            assert sorted(ids(listener)) == sorted([first, second])

    anyio.run(scenario)


def test_after_a_long_pause_the_oldest_waiting_todo_is_rung_on_resume(manual):
    server, clock = manual
    endpoint = vend(server)
    app = server.container.app
    listener = ChannelListener()

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await streaming(server, endpoint)
            await call(app.set_queue_controls, endpoint["slug"], "work", caller=CLI, paused=True)
            await anyio.sleep(QUIET)
            oldest = (await call(app.push, endpoint["slug"], "first", caller=CLI))["todo"]["id"]
            clock.advance(seconds=1)
            await call(app.push, endpoint["slug"], "second", caller=CLI)
            clock.advance(minutes=3)  # past their first ring's minute, before the 5-minute re-ring
            await anyio.sleep(QUIET)
            assert listener.received == []

            await call(app.set_queue_controls, endpoint["slug"], "work", caller=CLI, paused=False)
            await rings_of(listener, total=1)
            await anyio.sleep(QUIET)
            assert ids(listener) == [oldest]

    anyio.run(scenario)


def test_a_queue_at_max_in_flight_rings_its_waiting_todo_when_a_claim_ends(server):
    endpoint, app, agent, listener = setting(server)

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await streaming(server, endpoint)
            await call(app.set_queue_controls, endpoint["slug"], "work", caller=CLI, max_in_flight=1)
            first = (await call(app.push, endpoint["slug"], "first", caller=CLI))["todo"]["id"]
            await rings_of(listener, total=1)
            await call(app.claim, first, caller=agent)
            await anyio.sleep(QUIET)
            waiting = (await call(app.push, endpoint["slug"], "waiting", caller=CLI))["todo"]["id"]
            await anyio.sleep(QUIET)
            assert ids(listener) == [first]  # the queue cannot admit: no ring

            await call(app.complete, first, caller=agent)
            await rings_of(listener, total=2)
            assert ids(listener) == [first, waiting]

    anyio.run(scenario)


def test_a_delayed_todo_is_rung_when_due_and_claimable_only_from_then(server):
    endpoint, app, agent, listener = setting(server)

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await streaming(server, endpoint)
            not_before = datetime.now(timezone.utc) + timedelta(seconds=1.5)
            todo = (await call(app.push, endpoint["slug"], "later", caller=CLI,
                               not_before=not_before.isoformat()))["todo"]["id"]
            while datetime.now(timezone.utc) < not_before - timedelta(milliseconds=100):
                assert (await call(app.claim_next, caller=agent)) == {"empty": True}
                assert listener.received == []
                await anyio.sleep(0.1)
            await rings_of(listener, total=1, timeout=2.5)
            rung_at = datetime.now(timezone.utc)
            assert not_before <= rung_at < not_before + timedelta(seconds=1.2)
            assert ids(listener) == [todo]
            assert (await call(app.claim_next, caller=agent))["todo"]["id"] == todo

    anyio.run(scenario)


def test_a_snoozed_todo_is_rung_when_its_snooze_ends(server):
    endpoint, app, agent, listener = setting(server)

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await streaming(server, endpoint)
            todo = (await call(app.push, endpoint["slug"], "wait for CI", caller=CLI))["todo"]["id"]
            await rings_of(listener, total=1)
            await call(app.claim, todo, caller=agent)
            released = time.monotonic()
            await call(app.release, todo, caller=agent, delay_seconds=1)
            await anyio.sleep(0.5)
            assert len(listener.received) == 1  # not at the release: the todo is snoozed
            await rings_of(listener, total=2, timeout=RING_WAIT)
            assert 1.0 <= time.monotonic() - released < 2.5
            assert ids(listener) == [todo, todo]

    anyio.run(scenario)


@pytest.fixture
def manual(tmp_path) -> Iterator[tuple[InProcess, ManualClock]]:
    clock = ManualClock(datetime.now(timezone.utc).replace(microsecond=0))
    running = InProcess(tmp_path, clock=clock).start()
    try:
        yield running, clock
    finally:
        running.stop()


def test_attach_rings_the_oldest_waiting_todo_of_a_queue_that_can_admit(manual):
    server, clock = manual
    endpoint = vend(server, queues=("held", "open"))
    app = server.container.app
    listener = ChannelListener()
    app.set_queue_controls(endpoint["slug"], "held", caller=CLI, paused=True)
    app.push(endpoint["slug"], "in the paused queue", caller=CLI, queue="held")
    clock.advance(seconds=1)
    oldest_open = app.push(endpoint["slug"], "oldest open", caller=CLI, queue="open")["todo"]["id"]
    clock.advance(seconds=1)
    app.push(endpoint["slug"], "newer open", caller=CLI, queue="open")
    clock.advance(minutes=2)  # past every due ring's grace: only the attach rings now

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await rings_of(listener, total=1)
            await anyio.sleep(QUIET)
            assert ids(listener) == [oldest_open]

    anyio.run(scenario)


def test_attach_never_rings_a_paused_queue(manual):
    server, clock = manual
    endpoint = vend(server)
    app = server.container.app
    listener = ChannelListener()
    app.set_queue_controls(endpoint["slug"], "work", caller=CLI, paused=True)
    app.push(endpoint["slug"], "held back", caller=CLI)
    clock.advance(minutes=2)

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await streaming(server, endpoint)
            await anyio.sleep(QUIET * 2)
            assert listener.received == []

    anyio.run(scenario)


def held_delivery(server: InProcess, endpoint: dict) -> str:
    """An untrusted sender's delivery over real HTTP: its todo held in the endpoint's quarantine."""
    import uuid

    import httpx

    from tests.fixtures import fixture, sign

    hook = server.container.webhooks.create(caller=CLI, endpoint=endpoint["slug"], source_type="github",
                                            target_queue="work")
    server.container.webhooks.set_trust(hook["webhook_id"], caller=CLI, senders=["octocat-alice"], associations=None)
    body = fixture("github_issue_comment_created.json")  # sent by drive-by-dana: not trusted
    headers = {"content-type": "application/json", "x-github-event": "issue_comment",
               "x-github-delivery": str(uuid.uuid4()), **sign("github", hook["signing_secret"], body)}
    answer = httpx.post(hook["ingest_url"], content=body, headers=headers, timeout=30).json()
    assert answer["held"] is True and answer["todos"][0]["queue"] == "quarantine", answer
    return answer["id"]


async def attach_and_listen(endpoint: dict) -> list[str]:
    """Opens a session (its GET stream), waits for what ringing on attach brings, closes it: the
    todo ids it was rung for."""
    listener = ChannelListener()
    async with connect(endpoint, listener):
        with anyio.move_on_after(RING_WAIT):
            await rings_of(listener, total=1)
        await anyio.sleep(QUIET)  # and nothing more
    return ids(listener)


def test_attach_never_rings_a_held_todo_and_rings_the_oldest_claimable_one_instead(manual):
    server, clock = manual
    endpoint = vend(server)
    app = server.container.app
    held = held_delivery(server, endpoint)  # the oldest todo of the endpoint
    clock.advance(minutes=2)  # past every due ring's grace: only the attach rings now
    assert anyio.run(attach_and_listen, endpoint) == []

    clock.advance(seconds=1)
    waiting = app.push(endpoint["slug"], "claimable", caller=CLI)["todo"]["id"]
    clock.advance(minutes=2)
    assert anyio.run(attach_and_listen, endpoint) == [waiting]
    assert app.get_todo(held, caller=CLI)["queue"] == "quarantine"  # still held, never rung


def test_attach_passes_over_a_queue_at_max_in_flight_and_a_todo_not_yet_due(manual):
    server, clock = manual
    endpoint = vend(server, queues=("full", "open"))
    app, agent = server.container.app, Caller("endpoint", endpoint["slug"])
    app.set_queue_controls(endpoint["slug"], "full", caller=CLI, max_in_flight=1)
    claimed = app.push(endpoint["slug"], "claimed", caller=CLI, queue="full")["todo"]["id"]
    app.claim(claimed, caller=agent)
    clock.advance(seconds=1)
    app.push(endpoint["slug"], "waits for a place", caller=CLI, queue="full")
    clock.advance(seconds=1)
    app.push(endpoint["slug"], "not yet due", caller=CLI, queue="open", delay_seconds=3600)
    clock.advance(seconds=1)
    oldest_claimable = app.push(endpoint["slug"], "oldest claimable", caller=CLI, queue="open")["todo"]["id"]
    clock.advance(seconds=1)
    app.push(endpoint["slug"], "newer", caller=CLI, queue="open")
    clock.advance(minutes=2)
    assert anyio.run(attach_and_listen, endpoint) == [oldest_claimable]

    app.complete(claimed, caller=agent)  # `full` admits again: its waiting todo is now the oldest
    clock.advance(minutes=2)
    waiting = [t["id"] for t in app.list_todos(caller=CLI, queue="full", state="pending")]
    assert anyio.run(attach_and_listen, endpoint) == waiting


def test_a_todo_rung_on_attach_is_not_rung_again_by_its_first_due_ring(manual):
    """A todo that becomes claimable between a scan's read of the due rings and its ring on
    attach is rung on attach; its ring 0, due at the next scan, must not ring the session again
    (seen under load: `[first, first]`)."""
    server, _ = manual
    endpoint = vend(server)
    app = server.container.app
    doorbell = server.gateway.doorbell
    real_due, landed = doorbell.rings.due, []

    def due_then_a_commit(endpoints, now):  # the push lands right after this scan read its due rings
        rings = real_due(endpoints, now)
        if not landed:
            landed.append(app.push(endpoint["slug"], "landed mid-scan", caller=CLI)["todo"]["id"])
        return rings

    doorbell.rings.due = due_then_a_commit
    listener = ChannelListener()

    async def scenario() -> None:
        async with connect(endpoint, listener):
            await rings_of(listener, total=1)
            await anyio.sleep(QUIET)
            assert ids(listener) == landed

    anyio.run(scenario)
