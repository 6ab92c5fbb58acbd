"""Sealing with real processes (CONTRACT §14): a store from before the chain is sealed from
position 1 when `serve` first starts; two `serve` processes and the CLI writing at once on
PostgreSQL get every event sealed once, in order, within 1 s of its commit.

An event's time stamp is taken before its commit, and on a loaded machine a commit can come a
second after it; so a todo this file opens is timed from the answer that acknowledged it (after
its commit, so never earlier than the commit), every other event from its time stamp."""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from datetime import datetime

import httpx
import pytest

from application.service import Caller
from tests.e2e._ingest import Stack, query
from tests.e2e._support import Cli, execute_sql

CLI = Caller.cli()
METRICS_TOKEN = "m" * 40
POSITION = {"sqlite": "rowid", "postgres": "notification_id"}


def _dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgres"


def _max_position(url: str) -> int:
    return int(query(url, f"SELECT max({POSITION[_dialect(url)]}) FROM stored_events")[0][0] or 0)


def _wait_sealed(url: str, position: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query(url, "SELECT position FROM sb_audit_head WHERE id = 1")[0][0] >= position:
            return
        time.sleep(0.05)
    raise AssertionError(f"not sealed to position {position} within {timeout} s")


def _micros(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1_000_000)


def _lateness(exported: list[dict], sealed_at: dict[int, int], answered: dict[str, float]) -> list[tuple[int, float]]:
    """(position, seconds from commit to seal) per event: from the answer that acknowledged the
    todo the event opened, where the test has one, otherwise from the event's time stamp."""
    late = []
    for record in exported:
        committed = _micros(record["time"]) / 1e6
        if record["type"] == "TodoOpened" and record["data"]["title"] in answered:
            committed = answered[record["data"]["title"]]
        late.append((record["position"], sealed_at[record["position"]] / 1e6 - committed))
    return late


def test_a_store_from_before_the_chain_is_sealed_from_position_1_on_first_start(store_url, tmp_path, make_container):
    container = make_container(store_url)
    app = container.app
    app.ensure_admin()
    vended = app.vend("worker", queues=["work"], caller=CLI)
    for n in range(30):
        app.push(vended["slug"], f"old todo {n}", caller=CLI, payload={"n": n, "pad": "x" * n})
    before = list(app.audit())
    # the store as this version's predecessor left it: the same events, no chain tables
    for table in ("sb_audit_chain", "sb_audit_head"):
        execute_sql(store_url, f"DROP TABLE {table}")
    container.close()

    stack = Stack(store_url, tmp_path / "serve", SWITCHBOARD_METRICS_TOKEN=METRICS_TOKEN).start()
    try:
        cli = Cli(store_url, tmp_path / "serve")
        token = cli.json("operator", "token", "admin")["token"]
        _wait_sealed(store_url, _max_position(store_url), timeout=5)
        sealed = [p for (p,) in query(store_url, "SELECT position FROM sb_audit_chain ORDER BY position")]
        assert sealed[:len(before)] == [r["position"] for r in before] and sealed[0] == 1
        assert sealed == [p for (p,) in query(store_url, f"SELECT {POSITION[_dialect(store_url)]} FROM stored_events"
                                                         f" ORDER BY {POSITION[_dialect(store_url)]}")]
        verdict = cli.run("audit", "verify").ok().stdout
        exported = [json.loads(line) for line in cli.run("audit", "export").ok().stdout.splitlines()]
        assert verdict.strip() == f"chain intact: {len(sealed)} events, head {exported[-1]['hash']}"
        # it reads the same: `app.audit()` is `audit export`, and the chain sealed anew from position
        # 1 gives each event the hash it had before the chain's tables were dropped
        assert exported[:len(before)] == before
        cli.run("projections", "rebuild", "--verify").ok()
        head = httpx.get(f"{stack.server.base}/api/v1/audit/head", headers={"Authorization": f"Bearer {token}"}).json()
        assert head == {"position": exported[-1]["position"], "hash": exported[-1]["hash"], "time": exported[-1]["time"]}
        assert cli.json("audit", "head") == head
        assert httpx.get(f"{stack.server.base}/api/v1/audit/head").status_code == 401
        metrics = httpx.get(f"{stack.server.base}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
        assert f"switchboard_audit_sealed_position {float(head['position'])}" in metrics
        assert "switchboard_audit_unsealed_events 0.0" in metrics
    finally:
        stack.close()


@pytest.mark.postgres
def test_two_servers_and_the_cli_writing_at_once_get_every_event_sealed_once_in_order_within_a_second(
        pg_url, tmp_path):
    stack = Stack(pg_url, tmp_path, secret_key=secrets.token_hex(32)).start()
    other = stack.another_server("second")
    try:
        vended = stack.vend("worker", ["work"])
        token = stack.cli.json("operator", "token", "admin")["token"]
        stop = time.monotonic() + 6
        errors: list[str] = []
        answered: dict[str, float] = {}  # title -> when its push was acknowledged

        def push_over_http(base: str, name: str) -> None:
            with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
                n = 0
                while time.monotonic() < stop:
                    answer = client.post(f"{base}/api/v1/endpoints/{vended['slug']}/todos",
                                         json={"title": f"{name} {n}", "payload": {"n": n, "by": name}})
                    answered[f"{name} {n}"] = time.time()
                    if answer.status_code != 201:
                        errors.append(answer.text)
                    n += 1

        def push_with_the_cli() -> None:
            n = 0
            while time.monotonic() < stop:
                result = stack.cli.run("todo", "push", vended["slug"], f"cli {n}", "--payload", json.dumps({"n": n}))
                answered[f"cli {n}"] = time.time()
                if result.code != 0:
                    errors.append(str(result))
                n += 1

        writers = [threading.Thread(target=push_over_http, args=(stack.server.base, "first")),
                   threading.Thread(target=push_over_http, args=(other.base, "second")),
                   threading.Thread(target=push_with_the_cli)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        assert not errors, errors[:3]
        _wait_sealed(pg_url, _max_position(pg_url), timeout=3)

        events = query(pg_url, "SELECT notification_id FROM stored_events ORDER BY notification_id")
        chain = query(pg_url, "SELECT position, sealed_at FROM sb_audit_chain ORDER BY position")
        assert [p for p, _ in chain] == [p for (p,) in events]  # each event sealed, once, in log order
        exported = [json.loads(line) for line in stack.cli.run("audit", "export").ok().stdout.splitlines()]
        titles = {r["data"]["title"].split()[0] for r in exported if r["type"] == "TodoOpened"}
        assert titles == {"first", "second", "cli"}
        late = _lateness(exported, dict(chain), answered)
        assert max(seconds for _, seconds in late) < 1.0, sorted(late, key=lambda x: -x[1])[:5]
        assert stack.cli.run("audit", "verify").ok().stdout.startswith(f"chain intact: {len(events)} events")
    finally:
        other.stop()
        stack.close()


def _projector_of(pid: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in os.listdir(f"/proc/{pid}/task"):  # a restarted one is its supervisor thread's child
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                        if b"interfaces.projector_process" in cmdline.read():
                            return int(child)
        time.sleep(0.05)
    raise AssertionError("serve started no projector process")


def test_the_projector_process_seals_and_serve_stands_in_while_it_is_gone(store_url, tmp_path):
    """`serve`'s projector process seals the chain (docs/adr/0032); killed, it is restarted after a
    second or more, and meanwhile `serve`'s standby sealer keeps every event within 1 s."""
    stack = Stack(store_url, tmp_path).start()
    try:
        vended = stack.vend("worker", ["work"])
        token = stack.cli.json("operator", "token", "admin")["token"]
        headers = {"Authorization": f"Bearer {token}"}

        answered: dict[str, float] = {}  # title -> when its push was acknowledged

        def push(seconds: float, name: str) -> None:
            stop = time.monotonic() + seconds
            with httpx.Client(base_url=stack.server.base, timeout=30, headers=headers) as client:
                n = 0
                while time.monotonic() < stop:
                    answer = client.post(f"/api/v1/endpoints/{vended['slug']}/todos", json={"title": f"{name} {n}"})
                    answered[f"{name} {n}"] = time.time()
                    assert answer.status_code == 201, answer.text
                    n += 1
                    time.sleep(0.02)

        push(1.0, "before")
        projector = _projector_of(stack.server.proc.pid)
        os.kill(projector, signal.SIGKILL)
        push(2.5, "without")  # the projector is restarted after RESTART_DELAY (1 s) and its start-up
        assert _projector_of(stack.server.proc.pid) != projector
        push(1.0, "after")
        _wait_sealed(store_url, _max_position(store_url), timeout=3)
        exported = [json.loads(line) for line in stack.cli.run("audit", "export").ok().stdout.splitlines()]
        sealed_at = dict(query(store_url, "SELECT position, sealed_at FROM sb_audit_chain"))
        late = _lateness(exported, sealed_at, answered)
        assert sorted(sealed_at) == [r["position"] for r in exported]  # every event sealed, once
        assert max(seconds for _, seconds in late) < 1.0, sorted(late, key=lambda x: -x[1])[:5]
        assert {r["data"]["title"].split()[0] for r in exported if r["type"] == "TodoOpened"} == {
            "before", "without", "after"}
        assert stack.cli.run("audit", "verify").ok().stdout.startswith("chain intact")
    finally:
        stack.close()
