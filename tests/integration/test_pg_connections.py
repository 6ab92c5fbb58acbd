"""CONTRACT §12, connections: SWITCHBOARD_PG_POOL_SIZE bounds one process's request pool, a request
waits at most 1 s for a connection (then 503 `store down`), a serve process opens no more than its
pool plus the writer's two, the claim candidates' two, the doorbell's listener and the projector
child's two (deploy/README.md), and the projector child waits for connections instead of
crash-looping when there are none."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import httpx
import psycopg
import pytest

from application.errors import ConfigurationError, StoreUnavailable
from application.service import Caller
from interfaces.bootstrap import build
from interfaces.settings import Settings
from interfaces.store.database import Database, DatabaseUrl
from tests.conftest import PG_ADMIN_URL
from tests.e2e._support import Server, clean_env
from tests.integration._pgproxy import PgProxy

pytestmark = pytest.mark.postgres

CLI = Caller.cli()


def connections(url: str) -> Counter:
    """The database's sessions by kind (application_name without its per-session suffix)."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute("SELECT application_name FROM pg_stat_activity WHERE datname = %s", (name,)).fetchall()
    return Counter(row[0].rsplit("-", 1)[0] if row[0].startswith("switchboard-writer-") else row[0] for row in rows)


def test_the_pool_size_setting():
    assert Settings.from_env({}).pg_pool_size == 10
    assert Settings.from_env({"SWITCHBOARD_PG_POOL_SIZE": "3"}).pg_pool_size == 3
    with pytest.raises(ConfigurationError):
        Settings.from_env({"SWITCHBOARD_PG_POOL_SIZE": "many"})
    with pytest.raises(ConfigurationError, match="SWITCHBOARD_PG_POOL_SIZE"):
        Settings.from_env({"SWITCHBOARD_PG_POOL_SIZE": "0"}).check()


def test_a_request_waits_at_most_a_second_for_a_free_connection(pg_url):
    db = Database(DatabaseUrl.parse(pg_url), pool_size=1)
    db.open()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.transaction() as tx:
            tx.execute("SELECT 1")
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="no free PostgreSQL connection within 1 s"):
            db.query("SELECT 1")
        took = time.monotonic() - started
        assert 0.9 <= took < 1.5, took
        assert db.ping() is False  # /healthz says so too, as fast
    finally:
        release.set()
        holder.join()
    assert db.query("SELECT 1") == [(1,)]
    db.close()


def test_a_connect_that_hangs_costs_a_request_one_second_and_the_store_is_back_at_once(pg_url):
    proxy, proxied = PgProxy.before(pg_url)
    db = Database(DatabaseUrl.parse(proxied), pool_size=2)
    db.open()
    try:
        assert db.query("SELECT 1") == [(1,)]
        proxy.blackhole()  # a network that drops packets: libpq's shortest connect timeout is 2 s
        for _ in range(2):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                db.query("SELECT 1")
            took = time.monotonic() - started
            assert took < 1.5, took
        proxy.restore()
        started = time.monotonic()
        assert db.query("SELECT 1") == [(1,)]
        assert time.monotonic() - started < 1.0
    finally:
        proxy.close()
        db.close()


def test_a_serve_process_opens_its_pool_and_five_more_connections_at_most(pg_url, tmp_path):
    key = secrets.token_hex(32)
    server = Server(tmp_path / "var", tmp_path, url=pg_url, SWITCHBOARD_SECRET_KEY=key, SWITCHBOARD_INGEST_RATE="0",
                    SWITCHBOARD_PG_POOL_SIZE="3")
    server.env["SWITCHBOARD_BASE_URL"] = server.base
    (tmp_path / "var").mkdir()
    server.start()
    try:
        server.wait_healthy()
        container = build(Settings(database_url=pg_url, data_dir=str(tmp_path / "var"), secret_key=key,
                                   base_url=server.base, pg_pool_size=1))
        container.app.ensure_admin()
        endpoint = container.app.vend("many", queues=["work"], caller=CLI)
        hook = container.webhooks.create(caller=CLI, endpoint=endpoint["slug"], source_type="generic",
                                         target_queue="work")
        token = container.app.mint_operator_token("admin", caller=CLI)["token"]
        container.close()
        statuses: Counter = Counter()
        stop = time.monotonic() + 4

        def send() -> None:
            with httpx.Client(timeout=30) as http:
                while time.monotonic() < stop:
                    answer = http.post(hook["ingest_url"], content=json.dumps({"n": 1}).encode(),
                                       headers={"content-type": "application/json", "x-delivery-id": uuid.uuid4().hex})
                    statuses[answer.status_code] += 1

        def read() -> None:  # a delivery reads nothing before its append (ADR 31): the API's reads fill the pool
            with httpx.Client(timeout=30, headers={"authorization": f"Bearer {token}"}) as http:
                while time.monotonic() < stop:
                    statuses[http.get(f"{server.base}/api/v1/todos").status_code] += 1

        senders = [threading.Thread(target=send if i % 2 else read) for i in range(24)]
        for sender in senders:
            sender.start()
        peak: Counter = Counter()
        while time.monotonic() < stop:
            now = connections(pg_url)
            if sum(now.values()) > sum(peak.values()):
                peak = now
            time.sleep(0.1)
        for sender in senders:
            sender.join()
        assert statuses[202] > 0 and statuses[200] > 0 and set(statuses) == {200, 202}, statuses  # 24 clients, 3 connections
        assert peak["switchboard"] == 3, peak  # the pool, full
        assert sum(peak.values()) <= 3 + 5, peak
        assert peak["switchboard-writer"] <= 1 and peak["switchboard-writer-loop"] <= 1, peak  # the thread's, the loop's
        assert set(peak) <= {"switchboard", "switchboard-writer", "switchboard-writer-loop", "switchboard-doorbell",
                             "switchboard-projector"}, peak
    finally:
        server.stop()
    assert "Traceback" not in server.stderr(), server.output()


def test_claims_read_their_candidates_on_two_connections_of_their_own_at_most(pg_url):
    """The writer thread and its read-ahead read claim candidates on `switchboard-claims`
    sessions (docs/adr/0004, session 22): two at most however many claim, besides the pool."""
    container = build(Settings(database_url=pg_url, secret_key=secrets.token_hex(32), pg_pool_size=2))
    try:
        app = container.app
        app.ensure_admin()
        slug = app.vend("claims", queues=["work"], caller=CLI)["slug"]
        for n in range(300):
            app.push(slug, f"todo {n}", caller=CLI)
        caller = app.endpoint_caller(slug)
        done: list[int] = []

        def claim() -> None:
            while not (claimed := app.claim_next(caller=caller))["empty"]:
                app.complete(claimed["todo"]["id"], caller=caller)
                done.append(1)

        claimers = [threading.Thread(target=claim) for _ in range(8)]
        for claimer in claimers:
            claimer.start()
        peak: Counter = Counter()
        while any(claimer.is_alive() for claimer in claimers):
            now = connections(pg_url)
            peak = Counter({kind: max(peak[kind], now[kind]) for kind in now | peak})
            time.sleep(0.02)
        for claimer in claimers:
            claimer.join()
        assert len(done) == 300
        assert peak["switchboard-claims"] >= 1, peak  # the pool's size bounds it (2)
    finally:
        container.close()
    deadline = time.monotonic() + 10  # a backend ends a moment after its client closed
    while connections(pg_url)["switchboard-claims"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert connections(pg_url)["switchboard-claims"] == 0  # closed with the store


@pytest.fixture
def limited_role(pg_url):
    """A login role that may hold 3 sessions at once (superusers ignore connection limits), owning
    a database of its own with Switchboard's tables."""
    role = f"sb_limited_{uuid.uuid4().hex[:8]}"
    dbname = f"{role}_db"
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 3')
        conn.execute(f'CREATE DATABASE "{dbname}" OWNER "{role}"')
    url = f"postgresql://{role}@{base.rsplit('@', 1)[1]}/{dbname}"
    try:
        build(Settings(database_url=url, secret_key=secrets.token_hex(32))).close()
        yield url
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_the_projector_child_waits_for_a_connection_instead_of_crash_looping(limited_role, tmp_path):
    hogs = [psycopg.connect(limited_role) for _ in range(3)]  # every session the role may have
    env = clean_env(tmp_path, SWITCHBOARD_DATABASE_URL=limited_role)
    child = subprocess.Popen([sys.executable, "-m", "interfaces.projector_process"], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=os.getcwd())
    try:
        time.sleep(4)
        assert child.poll() is None, child.stderr.read()  # still there, waiting
        for hog in hogs:
            hog.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "switchboard-projector" not in connections(limited_role):
            time.sleep(0.2)
        assert "switchboard-projector" in connections(limited_role)  # it got its connections
    finally:
        for hog in hogs:
            hog.close()
        child.stdin.close()  # end of stdin: the child stops
        child.wait(timeout=10)
    log = child.stderr.read()
    assert child.returncode == 0, log
    assert "Traceback" not in log, log
    lines = log.strip().splitlines()
    assert len(lines) == 2, log  # one line when it could not, one when it could
    assert "projector: store unavailable (" in lines[0] and "too many connections" in lines[0], log
    assert lines[1].endswith("projector: store is back"), log
