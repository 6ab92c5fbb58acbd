"""End to end: an agent dies mid-attempt and another resumes from its checkpoint (CONTRACT §18).

A real `switchboard serve` on the controllable clock (SWITCHBOARD_CLOCK_FILE, ADR 29); agent A is
its own process with the official `mcp` client (tests/e2e/_attempt_agent.py): it claims a todo
opened by a delivery that carried a `traceparent`, heartbeats with a checkpoint and is SIGKILLed.
The test steps the clock past A's lease; the server's reaper lapses it; agent B's `claim_next`
(the `mcp` client in this process) gets `resume_from` equal to A's checkpoint and completes. The
attempts read `lapsed` then `completed`, on MCP, the CLI, the API and the board alike.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e._support import Cli, Server, clean_env, http_get
from tests.e2e.test_mcp import agent, call, connect
from tests.e2e.test_queue_limits_two_serves import SharedClock

LEASE = 30  # seconds of the app clock; the test steps past it instead of waiting
CHECKPOINT = {"step": 7, "files_done": ["a.py", "b.py"], "note": "half way ✓"}
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(tmp_path):
    clock = SharedClock(tmp_path / "clock")
    server = Server(tmp_path / "var", tmp_path, name="attempts", SWITCHBOARD_CLOCK_FILE=str(clock.path))
    server.env["SWITCHBOARD_BASE_URL"] = server.base
    cli = Cli(None, tmp_path / "var")
    server.start()
    try:
        server.wait_healthy()
        yield server, cli, clock
    finally:
        code = server.stop()
    assert code == 0, server.output()
    assert "Traceback" not in server.stderr(), server.output()


def _start_agent(vend: dict, tmp_path: Path) -> subprocess.Popen:
    env = clean_env(tmp_path, SWITCHBOARD_TEST_MCP_JSON=json.dumps(vend["mcp_json"]),
                    SWITCHBOARD_TEST_LEASE=str(LEASE), SWITCHBOARD_TEST_CHECKPOINT=json.dumps(CHECKPOINT),
                    PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-m", "tests.e2e._attempt_agent"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)


def test_a_killed_agent_lease_lapses_and_the_next_claim_resumes_from_its_checkpoint(stack, tmp_path):
    server, cli, clock = stack
    env = {"SWITCHBOARD_BASE_URL": server.base, "SWITCHBOARD_CLOCK_FILE": str(clock.path)}
    vend = cli.json("endpoint", "vend", agent("resume"), "--queue", "work", env=env)
    hook = cli.json("webhook", "create", "--endpoint", vend["slug"], "--source", "generic", "--queue", "work", env=env)
    delivered = httpx.post(hook["ingest_url"], json={"task": "port the tests"},
                           headers={"traceparent": PARENT, "x-delivery-id": agent("d")}, timeout=10)
    assert delivered.status_code == 202, delivered.text
    todo_id = delivered.json()["id"]

    a = _start_agent(vend, tmp_path)
    try:
        line = a.stdout.readline()
        assert line, f"agent A said nothing: {a.stderr.read() if a.poll() is not None else '(still running)'}"
        said = json.loads(line)
        assert said["claim"]["id"] == todo_id and said["claim"]["resume_from"] is None
        assert said["heartbeat"]["state"] == "claimed"
        a_trace, a_span = TRACEPARENT.fullmatch(said["claim"]["traceparent"]).groups()
        assert a_trace == PARENT.split("-")[1]  # the delivery's trace is the todo's
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
    assert a.returncode == -signal.SIGKILL

    async def agent_b() -> tuple[dict, dict, float]:
        async with connect(vend) as client:
            assert await call(client, "claim_next") == {"empty": True}  # A's lease still holds it
            clock.advance(timedelta(seconds=LEASE + 1))
            stepped = time.monotonic()
            with anyio.fail_after(10):
                while (answer := await call(client, "claim_next", claimant="agent-b"))["empty"]:
                    await anyio.sleep(0.05)
            waited = time.monotonic() - stepped
            todo = answer["todo"]
            await call(client, "complete", id=todo["id"], summary="resumed from step 7")
            return todo, await call(client, "get_todo", id=todo["id"]), waited

    claimed, final, waited = anyio.run(agent_b)
    assert waited < 1.5, f"the lapsed lease was reaped {waited:.2f} s after the clock passed it"
    assert claimed["id"] == todo_id and claimed["resume_from"] == CHECKPOINT
    lapsed, current = claimed["attempts"]
    assert (lapsed["n"], lapsed["claimant"], lapsed["outcome"], lapsed["checkpoint"]) == (1, "agent-a", "lapsed", CHECKPOINT)
    assert lapsed["traceparent"] == said["claim"]["traceparent"]
    assert (current["n"], current["claimant"], current["outcome"]) == (2, "agent-b", "claimed")
    b_trace, b_span = TRACEPARENT.fullmatch(claimed["traceparent"]).groups()
    assert (b_trace, claimed["traceparent"]) == (a_trace, current["traceparent"]) and b_span != a_span

    assert [(x["n"], x["outcome"]) for x in final["attempts"]] == [(1, "lapsed"), (2, "completed")]
    assert final["attempts"][1]["summary"] == "resumed from step 7" and final["state"] == "done"
    assert final["prior_attempts"][1]["outcome"] == "lease_expired"

    shown = cli.json("todo", "show", todo_id, env=env)  # the CLI, the same attempts
    assert shown["attempts"] == final["attempts"]
    history = cli.json("todo", "history", todo_id, env=env)["events"]
    assert [e["type"] for e in history] == ["TodoOpened", "TodoClaimed", "LeaseRenewed", "LeaseExpired",
                                            "TodoClaimed", "TodoCompleted"]
    assert history[2]["data"]["checkpoint"] == CHECKPOINT
    exported = [json.loads(line) for line in cli.run("audit", "export", env=env).ok().stdout.splitlines()]
    renewed = [e for e in exported if e["type"] == "LeaseRenewed" and e["aggregate"] == todo_id]
    assert renewed and renewed[0]["data"]["checkpoint"] == CHECKPOINT and renewed[0]["hash"]


def test_heartbeat_refuses_an_oversized_checkpoint_or_a_stale_fence_over_mcp(stack):
    server, cli, clock = stack
    env = {"SWITCHBOARD_BASE_URL": server.base, "SWITCHBOARD_CLOCK_FILE": str(clock.path)}
    vend = cli.json("endpoint", "vend", agent("limits"), "--queue", "work", env=env)
    todo_id = cli.json("todo", "push", vend["slug"], "heavy", env=env)["todo"]["id"]

    async def scenario() -> None:
        async with connect(vend) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "checkpoint" in tools["heartbeat"].input_schema["properties"]
            claimed = await call(client, "claim", id=todo_id, require_fence=True)
            big = await client.call_tool("heartbeat", {"id": todo_id, "lease_token": claimed["lease_token"],
                                                       "checkpoint": "x" * (64 * 1024)})
            assert big.is_error and big.content[0].text.startswith("invalid_argument: checkpoint is ")
            stale = await client.call_tool("heartbeat", {"id": todo_id, "lease_token": "stale", "checkpoint": 1})
            assert stale.is_error and stale.content[0].text.startswith("conflict: ")
            now = await call(client, "get_todo", id=todo_id)
            assert now["lease_expires_at"] == claimed["lease_expires_at"] and now["resume_from"] is None

    anyio.run(scenario)
