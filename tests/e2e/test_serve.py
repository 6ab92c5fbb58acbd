"""End to end: `switchboard serve` as a real subprocess (CONTRACT §1, §3 /healthz)."""

from __future__ import annotations

import re
import signal
import socket
import stat
import time

import psycopg
import pytest

from interfaces.version import VERSION
from tests.e2e._support import UNREACHABLE_PG, Server, http_get, run_serve

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
    secret = secret_file.read_text().strip()
    assert len(secret) >= 32
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
        # (psycopg_pool's 10 s connection timeout bounds how long an answer can take)
        while (answer := http_get(f"{server.base}/healthz", timeout=15)) != (503, "store down"):
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
