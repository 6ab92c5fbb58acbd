"""Queue limits hold across processes (CONTRACT §13): two real `switchboard serve` processes on one
disposable PostgreSQL database, 16 real MCP clients (8 on each) looping claim_next → complete.

- `max_in_flight` 3: a sampler counts the claimed todos throughout, and the event log, replayed in
  commit order, never has more than 3 claimed either.
- `max_claims_per_minute` 30: both servers run on the controllable clock (SWITCHBOARD_CLOCK_FILE,
  docs/adr/0029-controllable-clock.md), which the test steps forward for both at once, so several
  minutes pass in seconds. The claim times in the event log (stamped by each server's clock) never
  put more than 30 claims in any 60 s window, and claims are made in every minute.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from application.service import Caller
from tests.e2e._ingest import Stack
from tests.e2e._support import Server
from tests.e2e.test_mcp_sessions import ChannelListener, connect
from tests.integration._support import most_claimed_at_once, most_in_any_window

pytestmark = pytest.mark.postgres

CLI = Caller.cli()
CLAIMERS = 16
RATE = 30
MINUTES = 4
"""Minutes of the app clock the rate test runs for."""
STEP = timedelta(seconds=3)
STEP_EVERY = 0.25
"""Real seconds between two steps of the shared clock: 12 times faster than real time."""


class SharedClock:
    """The clock file both servers read: wall time plus `offset`, stepped by renaming a new file
    over it (so a server never reads half of one)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = timedelta(0)
        self._write()

    def advance(self, delta: timedelta) -> None:
        self.offset += delta
        self._write()

    def _write(self) -> None:
        new = self.path.with_suffix(".new")
        new.write_text(f"{self.offset.total_seconds()}\n")
        os.replace(new, self.path)


@contextmanager
def two_serves(pg_url: str, tmp_path: Path, **env: str) -> Iterator[tuple[Stack, Server]]:
    """Two `serve` processes on the store (with these settings), plus the store in-process."""
    stack = Stack(pg_url, tmp_path / "pg", secret_key=secrets.token_hex(32), **env).start()
    try:
        other = stack.another_server("second", **env)
        try:
            yield stack, other
        finally:
            other.stop()
            assert "Traceback" not in other.stderr(), other.output()
    finally:
        stack.close()


def pool(stack: Stack, other: Server, todos: int, **controls: Any) -> tuple[dict, set[str], list[str]]:
    """An endpoint with queue `work` under these controls and `todos` pending todos: the endpoint,
    the todos' ids and the MCP URL of each server."""
    endpoint = stack.vend("pool", ["work"])
    stack.app.set_queue_controls(endpoint["slug"], "work", caller=CLI, **controls)
    ids = {stack.app.push(endpoint["slug"], f"todo {i}", caller=CLI)["todo"]["id"] for i in range(todos)}
    return endpoint, ids, [endpoint["mcp_url"], f"{other.base}/mcp/{endpoint['slug']}"]


class Claimers:
    """16 MCP sessions, alternating between the servers, each looping claim_next → `hold` →
    complete until nothing is left or `stop` is set; refusals are counted by reason."""

    def __init__(self, endpoint: dict, urls: list[str], hold: Callable[[], Awaitable[None]], *,
                 refused_wait: float) -> None:
        self.endpoint, self.urls, self.hold, self.refused_wait = endpoint, urls, hold, refused_wait
        self.stop = anyio.Event()
        self.claimed = 0
        self.by_server = dict.fromkeys(urls, 0)
        self.refusals: dict[str, int] = {}
        self.retry_afters: set[int] = set()

    async def run(self, *also: Callable[[], Awaitable[None]]) -> None:
        async with anyio.create_task_group() as tasks:
            for i in range(CLAIMERS):
                tasks.start_soon(self._claimer, self.urls[i % len(self.urls)])
            for task in also:
                tasks.start_soon(task)

    async def _claimer(self, url: str) -> None:
        async with connect(self.endpoint, ChannelListener(), url=url) as client:
            while not self.stop.is_set():
                answer = (await client.call_tool("claim_next", {})).structured_content
                if answer["empty"]:
                    if "reason" not in answer:  # nothing left
                        return
                    self.refusals[answer["reason"]] = self.refusals.get(answer["reason"], 0) + 1
                    if "retry_after_seconds" in answer:
                        self.retry_afters.add(answer["retry_after_seconds"])
                    await anyio.sleep(self.refused_wait)
                    continue
                self.claimed += 1
                self.by_server[url] += 1
                await self.hold()
                done = await client.call_tool("complete", {"id": answer["todo"]["id"]})
                assert not done.is_error, done.content


def log_of(stack: Stack, todos: set[str]) -> list[tuple[str, str, datetime]]:
    """(type, todo id, time) of these todos' claims and completions, in commit order."""
    return [(r["type"], r["aggregate"], datetime.fromisoformat(r["time"])) for r in stack.app.audit()
            if r["aggregate"] in todos and r["type"] in ("TodoClaimed", "TodoCompleted")]


def test_sixteen_mcp_claimers_on_two_serves_never_hold_more_than_max_in_flight(pg_url, tmp_path):
    with two_serves(pg_url, tmp_path) as (stack, other):
        endpoint, todos, urls = pool(stack, other, 64, max_in_flight=3)
        samples: list[int] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                rows = stack.container.store.db.query(
                    "SELECT count(*) FROM sb_in_flight WHERE endpoint_id = %s", (endpoint["endpoint_id"],))
                samples.append(int(rows[0][0]))
                time.sleep(0.01)

        holding, peak = [0], [0]

        async def hold() -> None:
            holding[0] += 1
            peak[0] = max(peak[0], holding[0])
            await anyio.sleep(0.02)
            holding[0] -= 1

        claimers = Claimers(endpoint, urls, hold, refused_wait=0.01)
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            anyio.run(claimers.run)
        finally:
            sampling.set()
            sampler.join()

        print(f"in-flight samples: {len(samples)}, most {max(samples)}; most held by clients at once {peak[0]};"
              f" refusals {claimers.refusals}")
        assert peak[0] <= 3 and max(samples) <= 3 and set(claimers.refusals) == {"max_in_flight"}
        assert all(claimers.by_server.values()), claimers.by_server  # both servers took claims
        assert most_claimed_at_once(log_of(stack, todos)) == 3  # the limit was reached, never passed
        assert {r["state"] for r in stack.app.list_todos(caller=CLI, limit=1000)} == {"done"}


async def at_once() -> None:
    """Holds a claimed todo for no time."""


def test_sixteen_mcp_claimers_on_two_serves_never_pass_the_rate_in_any_60_second_window(pg_url, tmp_path):
    clock = SharedClock(tmp_path / "clock")
    with two_serves(pg_url, tmp_path, SWITCHBOARD_CLOCK_FILE=str(clock.path)) as (stack, other):
        assert "SWITCHBOARD_CLOCK_FILE" in stack.server.stderr() and "test hook" in other.stderr()
        # more todos than the minutes can admit: the rate, never the supply, bounds the claims
        endpoint, todos, urls = pool(stack, other, RATE * (MINUTES + 2), max_claims_per_minute=RATE)
        claimers = Claimers(endpoint, urls, at_once, refused_wait=0.2)
        started = time.monotonic()

        async def step_the_clock() -> None:
            with anyio.fail_after(60):
                while claimers.claimed == 0:  # the first claim at offset 0: then minutes pass
                    await anyio.sleep(0.02)
            while clock.offset < MINUTES * timedelta(minutes=1) + STEP:
                await anyio.sleep(STEP_EVERY)
                clock.advance(STEP)
            claimers.stop.set()

        anyio.run(claimers.run, step_the_clock)
        seconds = time.monotonic() - started
        claims = log_of(stack, todos)

    times = sorted(at for kind, _, at in claims if kind == "TodoClaimed")
    window = timedelta(minutes=1)
    worst = most_in_any_window(times, window)
    per_minute = [sum(1 for t in times if times[0] + k * window <= t < times[0] + (k + 1) * window)
                  for k in range(MINUTES)]
    print(f"{len(times)} claims over {(times[-1] - times[0]).total_seconds():.0f} s of the app clock in {seconds:.1f} s;"
          f" per minute {per_minute}; worst 60 s window {worst}; refusals {claimers.refusals};"
          f" retry_after_seconds {sorted(claimers.retry_afters)};"
          f" claims by server {list(claimers.by_server.values())}")
    assert worst <= RATE
    assert worst == RATE  # the budget was used
    assert all(n > 0 for n in per_minute), per_minute  # the limit admits again each minute, never stuck at zero
    assert set(claimers.refusals) == {"rate_limited"} and claimers.refusals["rate_limited"] > 0
    assert all(claimers.by_server.values()), claimers.by_server  # both servers took claims
    assert all(1 <= s <= 60 for s in claimers.retry_afters), claimers.retry_afters
