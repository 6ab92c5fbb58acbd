"""End to end: `switchboard serve` as a real subprocess (CONTRACT §1, §3 /healthz)."""

from __future__ import annotations

import re
import signal
import socket
import sqlite3
import stat
import time

import httpx
import psycopg
import pytest

from interfaces.version import VERSION
from tests.e2e._support import UNREACHABLE_PG, Cli, Server, http_get, run_serve

PASSWORD_LINE = re.compile(r"^created operator admin with password: (\S+)", re.M)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_and_second_start(store_url, tmp_path, make_container):
    """First start bootstraps `admin` once (printed, and in a 0600 file); a restart does not."""
    postgres = store_url.startswith("postgresql")
    url = store_url if postgres else None  # SQLite: the default, <data dir>/switchboard.db
    data_dir = tmp_path / "var"  # does not exist yet: serve creates it

    first = Server(data_dir, tmp_path, url=url, name="first")
    try:
        first.start()
        assert first.wait_healthy() == f"ok {VERSION}"
        assert re.fullmatch(r"ok \d+\.\d+\.\d+\S*", http_get(f"{first.base}/healthz")[1])
    finally:
        first_exit = first.stop()
    assert first_exit == 0, first.output()  # SIGTERM is a clean stop, not death by signal
    assert "Traceback" not in first.stderr(), first.output()

    printed = PASSWORD_LINE.findall(first.stdout())
    assert len(printed) == 1, first.output()
    password = printed[0]
    assert first.stdout().count(password) == 1, first.output()  # printed once
    assert len(password) >= 16
    password_file = data_dir / "admin-password"
    assert password_file.read_text().strip() == password
    assert _mode(password_file) == 0o600
    secret_file = data_dir / "secret-key"
    if postgres:  # the key is explicit there: none is generated
        assert not secret_file.exists()
    else:
        secret = secret_file.read_text().strip()
        assert re.fullmatch(r"[0-9a-f]{64}", secret)
        assert _mode(secret_file) == 0o600
    if not postgres:
        assert (data_dir / "switchboard.db").is_file()
    store = store_url if postgres else f"sqlite:///{data_dir}/switchboard.db"
    assert make_container(store).app.verify_password("admin", password)

    # a second start on the same store (and a metrics token of exactly 32 characters)
    second = Server(data_dir, tmp_path, url=url, name="second", SWITCHBOARD_METRICS_TOKEN="m" * 32)
    try:
        second.start()
        assert second.wait_healthy() == f"ok {VERSION}"
    finally:
        second_exit = second.stop(signal.SIGINT)  # Ctrl-C
    assert second_exit == 0, second.output()
    assert "Traceback" not in second.stderr() and "KeyboardInterrupt" not in second.stderr(), second.output()
    assert "password" not in second.stdout() and password not in second.stdout(), second.output()
    assert "serving on" in second.stdout(), second.output()
    assert password_file.read_text().strip() == password
    if not postgres:
        assert secret_file.read_text().strip() == secret


@pytest.mark.slow
def test_healthz_when_the_store_goes_away(pg_url, tmp_path):
    """The database disappears under a running server: /healthz answers 503 `store down`."""
    server = Server(tmp_path / "var", tmp_path, url=pg_url)
    try:
        server.start()
        assert server.wait_healthy() == f"ok {VERSION}"
        base, name = pg_url.rsplit("/", 1)
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        started = time.monotonic()
        # (a request waits 1 s at most for a connection: CONTRACT §12, docs/adr/0014)
        while (answer := http_get(f"{server.base}/healthz", timeout=5)) != (503, "store down"):
            assert answer[0] == 200 and time.monotonic() - started < 20, answer
            time.sleep(0.1)
    finally:
        exit_code = server.stop()
    assert exit_code == 0, server.output()
    assert "KeyboardInterrupt" not in server.stderr(), server.output()


@pytest.mark.parametrize(("env", "says"), [
    pytest.param({"SWITCHBOARD_DATABASE_URL": UNREACHABLE_PG}, "cannot reach PostgreSQL", id="unreachable-db"),
    pytest.param({"SWITCHBOARD_DATABASE_URL": "mysql://x"}, "bad database URL", id="bad-url"),
    pytest.param({"SWITCHBOARD_METRICS_TOKEN": "too-short"}, "SWITCHBOARD_METRICS_TOKEN", id="short-token"),
    pytest.param({"SWITCHBOARD_METRICS_TOKEN": "m" * 31}, "SWITCHBOARD_METRICS_TOKEN", id="31-char-token"),
    pytest.param({"SWITCHBOARD_CLOCK_FILE": "/nonexistent/clock"}, "SWITCHBOARD_CLOCK_FILE /nonexistent/clock",
                 id="missing-clock-file"),
])
def test_refused_start(tmp_path, env, says):
    started = time.monotonic()
    result = run_serve(tmp_path / "var", **env)
    assert time.monotonic() - started < 10
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert "password" not in result.stdout
    assert not (tmp_path / "var" / "admin-password").exists()


def test_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_serve(tmp_path / "var", port=taken.getsockname()[1])
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    assert "address already in use" in result.stderr.lower() or "errno 98" in result.stderr.lower(), result.stderr


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _projector_of(server: Server, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in _children(server.proc.pid):
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"interfaces.projector_process" in f.read():
                    return child
        time.sleep(0.05)
    raise AssertionError("serve started no projector process")


def _tracked_behind(url: str) -> dict[str, int]:
    """Each tracked read model's distance from the log's head, read straight from the database."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        (head,), = db.execute("SELECT max(rowid) FROM stored_events")
        return {name: head - position for name, position in db.execute("SELECT name, position FROM sb_tracking")}


def test_the_projector_process_keeps_read_models_current_and_ends_with_serve(tmp_path):
    """Read models are caught up by serve's projector child, with no reader asking; the child ends
    with serve, on SIGTERM as on SIGKILL (it notices its stdin close)."""
    url = f"sqlite:///{tmp_path}/switchboard.db"
    for stop in (signal.SIGTERM, signal.SIGKILL):
        server = Server(tmp_path, tmp_path, url=url, name=f"serve-{stop.name}").start()
        try:
            server.wait_healthy()
            projector = _projector_of(server)
            token = Cli(url, tmp_path).json("operator", "token", "admin")["token"]
            headers = {"Authorization": f"Bearer {token}"}
            slug = httpx.post(f"{server.base}/api/v1/endpoints", json={"agent": "p", "queues": ["q"]},
                              headers=headers, timeout=10).json()["slug"]
            for i in range(20):  # written by the server, which itself never catches up here
                httpx.post(f"{server.base}/api/v1/endpoints/{slug}/todos", json={"title": f"t{i}"},
                           headers=headers, timeout=10)
            deadline = time.monotonic() + 2
            while any(_tracked_behind(url).values()) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not any(_tracked_behind(url).values()), _tracked_behind(url)
        finally:
            server.stop(stop)
        deadline = time.monotonic() + 5
        while _alive(projector) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(projector), f"projector {projector} outlived serve ({stop.name})"
        assert "Traceback" not in server.stderr(), server.output()
