"""Helpers for the end-to-end tests: the real `switchboard` CLI and server as subprocesses."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

CLI_MODULE = [sys.executable, "-m", "interfaces.cli.main"]
SWITCHBOARD_SCRIPT = str(Path(sys.executable).with_name("switchboard"))
UNREACHABLE_PG = "postgresql://postgres@127.0.0.1:1/x"
# On PostgreSQL `serve` needs an explicit key (CONTRACT §12): Server and Cli pass this one unless
# the test gives its own.
PG_SECRET_KEY = "5b" * 32


def _keyed(url: str | None, env: dict[str, str]) -> dict[str, str]:
    if url and url.startswith("postgresql") and "SWITCHBOARD_SECRET_KEY" not in env:
        return {"SWITCHBOARD_SECRET_KEY": PG_SECRET_KEY, **env}
    return env


def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The test process's environment without any SWITCHBOARD_* setting, plus these."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    # every call is mostly interpreter start-up: keep compiled modules, outside the checkout
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir()) / "switchboard-e2e-pycache"))
    env.update(extra)
    return env


@dataclass
class Result:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    seconds: float

    def __str__(self) -> str:  # shown by pytest when an assertion fails
        return (f"$ switchboard {' '.join(self.args)}\nexit {self.code}\n"
                f"--stdout--\n{self.stdout}--stderr--\n{self.stderr}")

    def ok(self) -> Result:
        assert self.code == 0, str(self)
        assert "Traceback" not in self.stderr, str(self)
        return self

    def json(self) -> Any:
        self.ok()
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"stdout is not one JSON document:\n{self}") from None

    def refused(self, code: str, *, as_json: bool = False) -> str:
        """Asserts a refusal (exit 1, `error: <code>: …` as the only stderr line); returns the message."""
        assert self.code == 1, str(self)
        assert "Traceback" not in self.stderr, str(self)
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1, str(self)
        assert lines[0].startswith(f"error: {code}: "), str(self)
        message = lines[0][len(f"error: {code}: "):]
        assert message, str(self)
        if as_json:
            assert json.loads(self.stdout) == {"error": message, "code": code}, str(self)
        else:
            assert self.stdout == "", str(self)
        return message

    def usage(self) -> None:
        assert self.code == 2, str(self)
        assert "Traceback" not in self.stderr, str(self)
        assert "error:" in self.stderr, str(self)


class Cli:
    """Runs `python -m interfaces.cli.main …` against one store, with the URL in the environment."""

    def __init__(self, url: str | None, data_dir: Path) -> None:
        self.url = url
        self.data_dir = data_dir

    def env(self, **extra: str) -> dict[str, str]:
        settings = {"SWITCHBOARD_DATABASE_URL": self.url} if self.url else {}
        return clean_env(self.data_dir, **_keyed(self.url, settings | extra))

    def run(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 30) -> Result:
        started = time.monotonic()
        proc = subprocess.run(
            [*CLI_MODULE, *args], input=stdin if stdin is not None else "", capture_output=True, text=True,
            env=self.env(**(env or {})), cwd=self.data_dir, timeout=timeout,
        )
        return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    def json(self, *args: str, **kwargs: Any) -> Any:
        return self.run(*args, "--json", **kwargs).json()

    def run_all(self, *commands: tuple[str, ...]) -> list[Result]:
        """Runs independent, read-only commands side by side (each is mostly interpreter start-up)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda args: self.run(*args), commands))


def pairs(text: str) -> dict[str, str]:
    """The CLI's `key: value` plain output as a dict of strings."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        out[key] = value
    return out


def execute_sql(url: str, statement: str) -> int:
    """Runs one statement on the store behind the URL (to tamper with a read model); returns rowcount."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            with conn:
                return conn.execute(statement).rowcount
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement).rowcount


# -- the server ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Server:
    """`switchboard serve` as a subprocess; stdout and stderr go to files in `logs` (also its cwd)."""

    def __init__(self, data_dir: Path, logs: Path, *, url: str | None = None, name: str = "serve", **env: str) -> None:
        self.data_dir = data_dir
        self.logs = logs
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.out_path = logs / f"{name}.stdout"
        self.err_path = logs / f"{name}.stderr"
        settings = {"SWITCHBOARD_DATABASE_URL": url} if url else {}
        self.env = clean_env(data_dir, **_keyed(url, settings | env))
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [SWITCHBOARD_SCRIPT, "serve", "--port", str(self.port)],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=self.env, cwd=self.logs,
            )
        return self

    def wait_healthy(self, timeout: float = 20) -> str:
        """Polls GET /healthz until 200; returns its body."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, body = http_get(f"{self.base}/healthz", timeout=2)
                if status == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"serve did not answer /healthz within {timeout}s:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """SIGTERM (or `sig`), then kill after a grace period; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode

    def stdout(self) -> str:
        return self.out_path.read_text()

    def stderr(self) -> str:
        return self.err_path.read_text()

    def output(self) -> str:
        return f"--stdout--\n{self.stdout()}--stderr--\n{self.stderr()}"

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_serve(
    data_dir: Path, *, port: int | None = None, timeout: float = 15, **env: str,
) -> subprocess.CompletedProcess:
    """Runs `switchboard serve` expecting it to stop by itself (a refused start)."""
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [SWITCHBOARD_SCRIPT, "serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, text=True, env=clean_env(data_dir, **_keyed(env.get("SWITCHBOARD_DATABASE_URL"), env)),
        cwd=data_dir,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
