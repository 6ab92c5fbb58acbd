"""A disposable PostgreSQL cluster for the fault suite: created, stopped, started and dropped at will.

Debian's postgresql-common makes it (`pg_createcluster 15 <name> -p <port>`), listening on
127.0.0.1 only, trust auth, `fsync = off` (its data is thrown away; a stopped or crashed
PostgreSQL keeps every commit anyway — only an OS crash needs fsync). The faults act on this
cluster alone: the session's cluster on 5432 is never stopped, restarted or touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import psycopg

VERSION = "15"
SESSION_PORT = 5432
REQUIRE_PG = os.environ.get("SWITCHBOARD_REQUIRE_POSTGRES") == "1"
CONF_DIR = Path("/etc/postgresql") / VERSION


def unavailable_reason() -> str | None:
    """Why no disposable cluster can be made here, or None."""
    for tool in ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster"):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian's postgresql-common makes the fault suite's disposable clusters)"
    if not Path(f"/usr/lib/postgresql/{VERSION}/bin/postgres").exists():
        return f"PostgreSQL {VERSION} binaries not found in /usr/lib/postgresql/{VERSION}/bin"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        return "pg_createcluster needs root or the postgres user"
    return None


PREFIX = "sbfault_"


def drop_stale() -> list[str]:
    """Drops the clusters of fault runs whose process is gone (a run killed before its `finally`)."""
    listing = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True).stdout
    dropped = []
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != VERSION or not fields[1].startswith(PREFIX):
            continue
        pid = fields[1][len(PREFIX):].split("_")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["pg_dropcluster", "--stop", VERSION, fields[1]], capture_output=True)
            dropped.append(fields[1])
    return dropped


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """One throw-away cluster; `drop()` stops and removes it (call it in a `finally`)."""

    def __init__(self, *, max_connections: int = 60) -> None:
        self.name = f"{PREFIX}{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.port = free_port()
        assert self.port != SESSION_PORT and self.name != "main"
        self.max_connections = max_connections
        self.created = False

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")

    def create(self) -> Cluster:
        drop_stale()
        self._ctl("pg_createcluster", VERSION, self.name, "-p", str(self.port), "--start-conf", "manual",
                  "--", "--auth=trust")
        self.created = True
        (CONF_DIR / self.name / "conf.d" / "fault.conf").write_text(
            "listen_addresses = '127.0.0.1'\n"
            f"max_connections = {self.max_connections}\n"
            "fsync = off\n"
            "full_page_writes = off\n"
        )
        self.start()
        return self

    def start(self) -> None:
        self._ctl("pg_ctlcluster", VERSION, self.name, "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast` ends every session and shuts down cleanly; `immediate` is a crash (recovery at start)."""
        self._ctl("pg_ctlcluster", VERSION, self.name, "stop", "-m", mode)

    def accepting(self) -> bool:
        try:
            psycopg.connect(self.url(), connect_timeout=1).close()
            return True
        except psycopg.OperationalError:
            return False

    def wait_accepting(self, timeout: float = 60) -> float:
        """Polls until the cluster accepts a connection; returns that moment (time.monotonic())."""
        deadline = time.monotonic() + timeout
        while not self.accepting():
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.name} not accepting connections after {timeout} s")
            time.sleep(0.02)
        return time.monotonic()

    def drop(self) -> None:
        if self.created:
            self._ctl("pg_dropcluster", "--stop", VERSION, self.name)
            self.created = False

    # -- SQL ------------------------------------------------------------------------------------

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def new_database(self) -> tuple[str, str]:
        """A fresh database owned by a fresh ordinary role (no superuser: reserved slots do not
        apply to it, as for a real deployment's role); returns (url, role)."""
        name = f"sb_{uuid.uuid4().hex[:10]}"
        self.execute(f'CREATE ROLE "{name}" LOGIN')
        self.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
        return self.url(name, name), name

    def terminate(self, role: str) -> int:
        """Kills every backend of that role (`pg_terminate_backend`); returns how many."""
        rows = self.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE usename = %s AND pid <> pg_backend_pid()", (role,))
        return rows[0][0]

    def connections(self, role: str | None = None) -> int:
        """Client backends open now (of that role)."""
        sql = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        rows = self.execute(sql + " AND usename = %s", (role,)) if role else self.execute(sql)
        return rows[0][0] - (0 if role else 1)  # not counting this query's own connection

    def free_slots(self) -> int:
        """Connections an ordinary role may still open (superusers keep their reserved slots)."""
        reserved = int(self.execute("SHOW superuser_reserved_connections")[0][0])
        return self.max_connections - reserved - self.connections()
