"""The README's Python MCP client, run as written against a real `switchboard serve` with real todos.

The test takes the first ```python block under "### A Python client" in README.md, puts a vended
endpoint's `mcp_url` and credential in place of the two placeholders (nothing else changes), and
runs it as its own process with this interpreter. It must drain the todos already waiting, ring
and take one that arrives later through a webhook (rung over its `subscriptions/listen` stream,
in the SDK's default mode), and leave every one of them done.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e._support import Cli, Server, clean_env

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_client() -> str:
    text = README.read_text()
    section = text.split("### A Python client", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def with_endpoint(code: str, url: str, credential: str) -> str:
    code, urls = re.subn(r'^URL = "[^"]*"', f'URL = "{url}"', code, flags=re.M)
    code, credentials = re.subn(r'^CREDENTIAL = "[^"]*"', f'CREDENTIAL = "{credential}"', code, flags=re.M)
    assert (urls, credentials) == (1, 1), "the README client lost its URL or CREDENTIAL line"
    return code


class Lines:
    """A process's stdout, line by line, readable with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line.rstrip("\n")) for line in proc.stdout],
                         daemon=True).start()

    def settle(self, seconds: float) -> int:
        """Reads every line printed within `seconds`; how many lines have been seen."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.seen.append(self._lines.get(timeout=left))
            except queue.Empty:
                break
        return len(self.seen)

    def wait_for(self, pattern: str, timeout: float = 20, after: int = 0) -> re.Match[str]:
        """The first line from the `after`-th on that matches (waiting for it up to `timeout`)."""
        deadline = time.monotonic() + timeout
        for line in self.seen[after:]:
            if match := re.search(pattern, line):
                return match
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s; saw:\n" + "\n".join(self.seen))


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[Server, Cli]]:
    server = Server(tmp_path / "var", tmp_path, name="readme")
    server.env["SWITCHBOARD_BASE_URL"] = server.base
    server.start()
    try:
        server.wait_healthy()
        yield server, Cli(None, tmp_path / "var")
    finally:
        code = server.stop()
    assert code == 0, server.output()
    assert "Traceback" not in server.stderr(), server.output()


def test_the_readme_client_drains_the_queue_and_hears_the_doorbell(server, tmp_path):
    serve, cli = server
    base = {"SWITCHBOARD_BASE_URL": serve.base}
    vended = cli.json("endpoint", "vend", "readme-agent", "--queue", "work", env=base)
    waiting = [cli.json("todo", "push", vended["slug"], f"waiting {n}", "--payload", '{"n": 1}')["todo"]["id"]
               for n in range(2)]
    hook = cli.json("webhook", "create", "--endpoint", vended["slug"], "--source", "generic", "--queue", "work",
                    env=base)

    script = tmp_path / "client.py"
    script.write_text(with_endpoint(readme_client(), vended["mcp_url"], vended["credential"]))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(tmp_path), cwd=tmp_path)
    try:
        out = Lines(proc)
        for todo_id in waiting:
            out.wait_for(rf"^working on {todo_id} waiting \d$")
        mark = out.settle(1.0)  # drained (rings of the waiting todos taken too): it waits for the doorbell
        answer = httpx.post(hook["ingest_url"], json={"kind": "later"}, timeout=30)
        assert answer.status_code == 202, answer.text
        later = answer.json()["id"]
        out.wait_for(r"^doorbell: switchboard://queues/work$", after=mark)
        out.wait_for(rf"^working on {later} ", after=mark)
        for todo_id in (*waiting, later):  # the client completes each one (it keeps running, like an agent)
            deadline = time.monotonic() + 10
            while (state := cli.json("todo", "show", todo_id)["state"]) != "done" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert state == "done", todo_id
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
