"""Real clients for the fault suite: signed GitHub ingest over HTTP and MCP agents draining the
queue with the official `mcp` client (claim_next, then complete), every answer recorded.

Each answer keeps when it was asked, how long it took and what it said, so a scenario can hold
the event log against it afterwards (tests/faults/_ledger.py) and measure throughput around the
fault (bench/faults.py).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.fixtures import sign

CLIENT_TIMEOUT = 15.0  # seconds: a hang is recorded as `timeout`, long past any budget
STORE_DOWN = {"error": "store down", "code": "unavailable"}
LEASE_SECONDS = 3600  # no lease lapses during a scenario: a second claim of a todo is a bug
PAUSE_AFTER_REFUSAL = 0.05
HTTP_ERROR_STATUS = "Server returned an error response"  # the mcp client's words for a non-2xx answer


@dataclass
class Answer:
    kind: str  # "ingest", "claim_next", "complete", "session" (an MCP session opened)
    server: str
    started: float  # time.monotonic() when asked
    seconds: float
    outcome: str  # ok | empty | unavailable | conflict | refused | lost | timeout | error
    detail: str = ""
    status: int | None = None
    delivery: str | None = None
    todos: list[str] = field(default_factory=list)

    @property
    def ended(self) -> float:
        return self.started + self.seconds


def issue_body(n: int) -> bytes:
    """A small GitHub `issues opened` delivery (one todo on the webhook's queue)."""
    return json.dumps({
        "action": "opened",
        "issue": {"number": n, "title": f"fault load {n}", "user": {"login": "octocat"},
                  "author_association": "OWNER"},
        "repository": {"full_name": "octo-org/octo-repo"},
        "sender": {"login": "octocat"},
    }).encode()


class Load:
    """Ingest threads and MCP agents against `targets()` (the servers' base URLs, read at each
    request: a killed server is simply refused and the client moves to the next)."""

    def __init__(self, targets: Callable[[], list[str]], *, ingest_path: str, signing_secret: str,
                 mcp_path: str, credential: str, ingest_threads: int = 3, agents: int = 2) -> None:
        self.targets = targets
        self.ingest_path = ingest_path
        self.secret = signing_secret
        self.mcp_path = mcp_path
        self.credential = credential
        self.ingest_threads = ingest_threads
        self.agents = agents
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._counter = 0
        self._held: dict[int, str | None] = {}

    def record(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def start(self) -> Load:
        for i in range(self.ingest_threads):
            self._spawn(f"ingest-{i}", self._ingest, i)
        if self.agents:
            self._spawn("agents", lambda: anyio.run(self._agents))
        return self

    def _spawn(self, name: str, target: Callable, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=f"fault-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=CLIENT_TIMEOUT * 3)
            assert not thread.is_alive(), f"{thread.name} did not stop"

    def _next_number(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    # -- ingest -----------------------------------------------------------------------------------

    def _ingest(self, index: int) -> None:
        turn = index
        with httpx.Client(timeout=CLIENT_TIMEOUT) as http:
            while not self._stop.is_set():
                targets = self.targets()
                base = targets[turn % len(targets)]
                turn += 1
                answer = self.deliver(http, base)
                self.record(answer)
                if answer.outcome != "ok":
                    time.sleep(PAUSE_AFTER_REFUSAL)

    def deliver(self, http: httpx.Client, base: str) -> Answer:
        body = issue_body(self._next_number())
        delivery = str(uuid.uuid4())
        headers = {"content-type": "application/json", "x-github-event": "issues",
                   "x-github-delivery": delivery, **sign("github", self.secret, body)}
        started = time.monotonic()
        answer = Answer("ingest", base, started, 0.0, "error", delivery=delivery)
        try:
            response = http.post(base + self.ingest_path, content=body, headers=headers)
        except httpx.ConnectError as error:  # never reached the server: certainly nothing stored
            answer.outcome, answer.detail = "refused", str(error)
        except httpx.TimeoutException as error:
            answer.outcome, answer.detail = "timeout", repr(error)
        except httpx.TransportError as error:  # cut mid-request (a killed server): outcome unknown
            answer.outcome, answer.detail = "lost", repr(error)
        else:
            answer.status = response.status_code
            answer.detail = response.text[:300]
            if response.status_code == 202:
                answer.outcome = "ok"
                answer.todos = [ref["id"] for ref in response.json()["todos"]]
            elif response.status_code == 503 and _json(response) == STORE_DOWN:
                answer.outcome = "unavailable"
        answer.seconds = time.monotonic() - started
        return answer

    # -- MCP agents -------------------------------------------------------------------------------

    async def _agents(self) -> None:
        async with anyio.create_task_group() as group:
            for i in range(self.agents):
                group.start_soon(self._agent, i)

    async def _agent(self, index: int) -> None:
        turn = index
        self._held[index] = None  # a todo claimed and not yet answered `completed`
        while not self._stop.is_set():
            targets = self.targets()
            base = targets[turn % len(targets)]
            turn += 1
            started = time.monotonic()
            opened = False
            try:
                async with self._session(base) as client:
                    opened = True
                    self.record(Answer("session", base, started, time.monotonic() - started, "ok"))
                    await self._drain(client, base, index)
            except Exception as error:  # refused, the store down at authentication, or a call broke
                if not opened:  # (a broken call is recorded by _call)
                    self.record(Answer("session", base, started, time.monotonic() - started, "lost",
                                       detail=_describe(error)))
                await anyio.sleep(PAUSE_AFTER_REFUSAL)
        # (the stop may leave one todo claimed: it is never claimed again, which the ledger allows)

    @asynccontextmanager
    async def _session(self, base: str) -> AsyncIterator[Client]:
        """The official client in its default mode, as an agent configures it from `mcp_json`."""
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.credential}"},
                                      timeout=httpx2.Timeout(CLIENT_TIMEOUT, read=300)) as http:
            async with Client(streamable_http_client(base + self.mcp_path, http_client=http)) as client:
                yield client

    async def _drain(self, client: Client, base: str, index: int) -> None:
        """claim_next then complete, until stopped (the todo held survives a broken session)."""
        while not self._stop.is_set():
            if self._held[index] is None:
                answer = await self._call(client, base, "claim_next",
                                          {"lease_ttl_seconds": LEASE_SECONDS, "claimant": f"agent-{index}"})
                if answer.outcome == "ok":
                    self._held[index] = answer.todos[0]
                elif answer.outcome == "empty":
                    await anyio.sleep(0.05)
                    continue
                else:
                    await anyio.sleep(PAUSE_AFTER_REFUSAL)
                    continue
            todo = self._held[index]
            answer = await self._call(client, base, "complete", {"id": todo, "summary": "fault load"}, todo=todo)
            if answer.outcome in ("ok", "conflict", "error"):
                self._held[index] = None  # a conflict is judged by the ledger (done by an earlier answer?)
            else:
                await anyio.sleep(PAUSE_AFTER_REFUSAL)

    async def _call(self, client: Client, base: str, verb: str, arguments: dict[str, Any],
                    todo: str | None = None) -> Answer:
        started = time.monotonic()
        answer = Answer(verb, base, started, 0.0, "error", todos=[todo] if todo else [])
        try:
            with anyio.fail_after(CLIENT_TIMEOUT):
                result = await client.call_tool(verb, arguments)
        except TimeoutError:
            answer.outcome, answer.detail = "timeout", f"no answer within {CLIENT_TIMEOUT} s"
            answer.seconds = time.monotonic() - started
            self.record(answer)
            raise
        except MCPError as error:  # a JSON-RPC error, not a tool result
            answer.detail = f"MCPError {error.code}: {error.message}"[:300]
            answer.seconds = time.monotonic() - started
            if error.message == HTTP_ERROR_STATUS:  # the server answered: the session goes on
                answer.outcome = "error"
                answer.detail += " (an HTTP error status instead of a tool result)"
                self.record(answer)
                return answer
            # "Session terminated": the server does not know the session (it was restarted), so
            # nothing ran; anything else ("Connection closed", "SSE stream ended without a
            # response") is the connection cut under the call (a killed server): outcome unknown
            answer.outcome = "refused" if error.message == "Session terminated" else "lost"
            self.record(answer)
            raise
        except Exception as error:
            answer.outcome, answer.detail = "lost", _describe(error)
            answer.seconds = time.monotonic() - started
            self.record(answer)
            raise
        except anyio.get_cancelled_exc_class():
            # The session's transport failed under the call (a killed server answering a POST with
            # a JSON body: the client's task group ends, cancelling the call): outcome unknown
            answer.outcome, answer.detail = "lost", "cancelled: the session broke under the call"
            answer.seconds = time.monotonic() - started
            self.record(answer)
            raise
        answer.seconds = time.monotonic() - started
        text = result.content[0].text if result.content else ""
        answer.detail = text[:300]
        if result.is_error:
            code = text.split(":", 1)[0]
            answer.outcome = {"unavailable": "unavailable", "conflict": "conflict"}.get(code, "error")
        elif verb == "claim_next":
            content = result.structured_content
            if content.get("empty"):
                answer.outcome = "empty"
            else:
                answer.outcome, answer.todos = "ok", [content["todo"]["id"]]
        else:
            answer.outcome = "ok"
        self.record(answer)
        return answer


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"[:300]
