"""MCP drain throughput and doorbell latency against a real `switchboard serve` on PostgreSQL.

Run:  .venv/bin/python bench/mcp_drain.py [--todos 1000] [--sessions 8] [--rounds 3] [--rate 50]
                                          [--seconds 10] [--pg-url URL] [--quick]

Every PostgreSQL database used here is created fresh on the admin URL (`bench_<run id>_...`)
and dropped at the end, even on failure; the servers started here are stopped in `finally`.
Phases, all in one run, rounds 1 and 2 interleaved `--rounds` times (the first two swap order
each round):

1. MCP drain: a fresh database and data dir; one endpoint (queue "work") and, on a second
   endpoint, one GitHub webhook, created in-process; N todos pushed in-process each round
   (`app.push(..., caller=Caller.cli())`, from 8 threads, untimed) while `switchboard serve`
   runs as a subprocess on a free port. S sessions of the official `mcp` client (default mode:
   Streamable HTTP, handshake era, GET stream open, bearer credential) connect in one event
   loop of this process; once all are initialized, each loops `claim_next` + `complete`
   until `{"empty": true}`: todos/s from the release to the last session done, and the
   server's CPU (process and children) per tool call.
1b. SDK floor (SDK_FLOOR_APP): a bare server on the same SDK with its default settings
   (stateful sessions, an SSE stream per POST), mounted in Litestar under uvicorn as the
   other references and `serve` are, whose claim_next and complete answer fixed JSON of the
   size Switchboard answered in this run (N todos, then `{"empty": true}`); the same clients,
   driven the same way. `ratio mcp/sdk-floor` is the part of the SDK's own rate we keep.
2. Application layer: the same workload on a fresh database in-process (as
   bench/claim_complete.py): S threads calling `app.claim_next(caller=app.endpoint_caller(slug))`
   + `app.complete(...)`: todos/s; the ratio MCP/app is the protocol's overhead.
3. Doorbell latency (same server as 1, the doorbell endpoint): one MCP session with its GET
   stream open and a client extension bound to `notifications/claude/channel`; signed GitHub
   deliveries (unique X-GitHub-Delivery, each mints a todo) POSTed at R/s for T seconds from a
   keep-alive `http.client` thread. Latency per todo = ring arrival at the client (matched by
   meta.todo_id) minus the instant just before its POST; p50/p99/max, and how many rang
   (each exactly once expected). Nothing is claimed in this phase.

Figures are for THIS machine: the clients, the server and PostgreSQL share its cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.client import Client, ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from application.service import Caller  # noqa: E402
from bench.claim_complete import (  # noqa: E402
    Databases, drain, log, make_container, payload_for, pg_settings, push_todos, setup_endpoint,
)
from bench.ingest import (  # noqa: E402
    BENCH_SECRET_KEY, Server, clean_env, cpu_delta, free_port, percentile, postgres_cpu, stack_args,
    switchboard_server,
)
from interfaces.bootstrap import build  # noqa: E402
from interfaces.settings import Settings  # noqa: E402
from tests.fixtures import fixture, sign  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
CHANNEL = "notifications/claude/channel"
FIXTURE = "github_issues_opened.json"
PUSH_THREADS = 8

# The SDK floor: the same mcp SDK with its default settings (a stateful session manager, an SSE
# stream per POST, no event store), mounted in Litestar under uvicorn as `serve` mounts the
# gateway, with the two tools the drain calls answering fixed JSON of the size Switchboard's
# answers had in this run. It refuses a modern-era request with -32022, and both are driven the
# same way in the handshake era (the clients force mode="legacy"): initialize, a GET stream, then
# tools/call. No credential, no store, no thread hop.
SDK_FLOOR_APP = """\
import json
import os
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from litestar import Litestar, MediaType, asgi, get, post
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

CLAIMED = json.loads(os.environ["FLOOR_CLAIMED"])
COMPLETED = json.loads(os.environ["FLOOR_COMPLETED"])
SCHEMA = {"type": "object", "properties": {}}
left = [0]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name=n, description=n, input_schema=SCHEMA)
                                        for n in ("claim_next", "complete")])


async def call_tool(ctx, params):
    if params.name == "claim_next":
        answer = CLAIMED if left[0] > 0 else {"empty": True}
        left[0] -= 1
    else:
        answer = COMPLETED
    text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=answer)


server = Server("sdk-floor", on_list_tools=list_tools, on_call_tool=call_tool)
manager = StreamableHTTPSessionManager(server)
HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode()
REFUSAL = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": UNSUPPORTED_PROTOCOL_VERSION,
                      "message": "Unsupported protocol version",
                      "data": {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS)}}}).encode()


@asgi("/mcp", is_mount=True, copy_scope=True)
async def mcp(scope: Any, receive: Any, send: Any) -> None:
    version = next((v.decode() for k, v in scope["headers"] if k == HEADER), None)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": REFUSAL})
        return
    await manager.handle_request(scope, receive, send)


@post("/refill/{n:int}", status_code=200)
async def refill(n: int) -> str:
    left[0] = n
    return "ok"


@get("/healthz", media_type=MediaType.TEXT)
async def healthz() -> str:
    return "ok"


@asynccontextmanager
async def lifespan(app):
    async with manager.run():
        yield


app = Litestar(route_handlers=[mcp, refill, healthz], lifespan=[lifespan], openapi_config=None)
"""


# -- MCP client pieces -------------------------------------------------------------------


class ChannelParams(BaseModel):
    content: str
    meta: dict[str, str] = {}


class ChannelListener(ClientExtension):
    """Binds the doorbell's notification (the SDK drops unknown methods otherwise); stamps arrivals."""

    identifier = "dev.switchboard/bench-channel"

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []  # (todo id, perf_counter at arrival)

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def handle(params: ChannelParams) -> None:
            self.arrivals.append((params.meta.get("todo_id", ""), time.perf_counter()))

        return [NotificationBinding(method=CHANNEL, params_type=ChannelParams, handler=handle)]


async def open_session(stack: AsyncExitStack, url: str, credential: str, listener: ChannelListener) -> Client:
    """The official client in the handshake era (the doorbell needs a session; the default mode now
    picks the stateless era, ADR 38), with the bearer credential, as the vended mcp_json says."""
    http = await stack.enter_async_context(httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {credential}"}, timeout=httpx2.Timeout(30, read=300)))
    return await stack.enter_async_context(
        Client(streamable_http_client(url, http_client=http), extensions=[listener], mode="legacy"))


async def call(client: Client, verb: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(verb, arguments)
    if result.is_error:
        text = result.content[0].text if result.content else ""
        raise RuntimeError(f"{verb}: {text}")
    return result.structured_content


# -- setup -------------------------------------------------------------------------------


def setup_server_db(database_url: str, data_dir: str) -> dict[str, Any]:
    """Admin; the drain endpoint; the doorbell endpoint and its GitHub webhook; one todo claimed and
    completed in-process, whose two answers (what the MCP tools return) the SDK floor repeats."""
    container = build(Settings(database_url=database_url, data_dir=data_dir, secret_key=BENCH_SECRET_KEY))
    try:
        cli = Caller.cli()
        app = container.app
        app.ensure_admin()
        drain_ep = app.vend("mcp-drain", queues=["work"], caller=cli)
        bell_ep = app.vend("mcp-doorbell", queues=["inbox"], caller=cli)
        hook = container.webhooks.create(caller=cli, endpoint=bell_ep["slug"], source_type="github",
                                         target_queue="inbox")
        app.push(drain_ep["slug"], "sample todo", caller=cli, payload=payload_for(0))
        caller = app.endpoint_caller(drain_ep["slug"])
        claimed = app.claim_next(caller=caller)
        completed = app.complete(claimed["todo"]["id"], caller=caller)
        return {"drain": drain_ep, "bell": bell_ep, "token": hook["ingest_url"].rsplit("/", 1)[1],
                "secret": hook["signing_secret"], "claimed": claimed, "completed": completed}
    finally:
        container.close()


def push_round(database_url: str, data_dir: str, slug: str, todos: int, start_at: int) -> float:
    """`todos` pending todos on the drain endpoint, pushed in-process (untimed); returns todos/s."""
    container = build(Settings(database_url=database_url, data_dir=data_dir, secret_key=BENCH_SECRET_KEY))
    try:
        return todos / push_todos(container, slug, todos, PUSH_THREADS, start_at=start_at)
    finally:
        container.close()


def sdk_floor_server(label: str, app_dir: str, claimed: dict[str, Any], completed: dict[str, Any]) -> Server:
    """SDK_FLOOR_APP under uvicorn, started as the bench's other references are (same HTTP stack as serve)."""
    Path(app_dir, "sdk_floor_app.py").write_text(SDK_FLOOR_APP)
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "sdk_floor_app:app", "--app-dir", app_dir, "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *stack_args()]
    env = clean_env(FLOOR_CLAIMED=json.dumps(claimed), FLOOR_COMPLETED=json.dumps(completed))
    return Server(label, argv, env, app_dir, port)


def refill(server: Server, todos: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", f"/refill/{todos}")
        if conn.getresponse().status != 200:
            raise RuntimeError("the SDK floor refused its refill")
    finally:
        conn.close()


# -- phase 1: MCP drain ------------------------------------------------------------------


def mcp_drain(server: Server | list[Server], endpoint: dict[str, Any], sessions: int) -> dict[str, Any]:
    """Given several servers (processes on one database), session i opens on server i mod n and
    stays there (sticky, as a load balancer routing by Mcp-Session-Id would keep it)."""
    servers = server if isinstance(server, list) else [server]
    urls = [f"http://127.0.0.1:{s.port}/mcp/{endpoint['slug']}" for s in servers]
    listeners = [ChannelListener() for _ in range(sessions)]
    done = [0] * sessions
    calls = [0] * sessions
    out: dict[str, Any] = {}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            started = time.perf_counter()
            clients = []
            for i in range(sessions):
                clients.append(await open_session(stack, urls[i % len(urls)], endpoint["credential"], listeners[i]))
            out["connect"] = time.perf_counter() - started
            go = anyio.Event()

            async def worker(i: int) -> None:
                client = clients[i]
                await go.wait()
                while True:
                    claimed = await call(client, "claim_next")
                    calls[i] += 1
                    if claimed.get("empty"):
                        return
                    await call(client, "complete", id=claimed["todo"]["id"])
                    calls[i] += 1
                    done[i] += 1

            async with anyio.create_task_group() as tasks:
                for i in range(sessions):
                    tasks.start_soon(worker, i)
                await anyio.sleep(0.3)  # every session initialized; let the GET streams settle
                cpu0, client0, pg0 = sum(s.cpu_seconds() for s in servers), time.process_time(), postgres_cpu()
                out["t0"] = time.perf_counter()
                go.set()
            out["seconds"] = time.perf_counter() - out["t0"]
            out["server_cpu_seconds"] = sum(s.cpu_seconds() for s in servers) - cpu0
            out["server_cpu"] = out["server_cpu_seconds"] / out["seconds"]
            out["client_cpu"] = (time.process_time() - client0) / out["seconds"]
            out["pg_cpu"] = cpu_delta(pg0, postgres_cpu()) / out["seconds"]

    anyio.run(scenario)
    total = sum(done)
    out.update(done=total, per_session=done, calls=sum(calls),
               rate=total / out["seconds"] if out["seconds"] else 0.0,
               cpu_per_call=out["server_cpu_seconds"] / sum(calls) if sum(calls) else 0.0,
               rings=sum(len(listener.arrivals) for listener in listeners))
    return out


# -- phase 2: application layer ----------------------------------------------------------


def app_drain(url: str, data_dir: str, todos: int, workers: int) -> dict[str, Any]:
    container = make_container(url, data_dir)
    try:
        slug = setup_endpoint(container)
        push_todos(container, slug, todos, PUSH_THREADS)
        client0, pg0 = time.process_time(), postgres_cpu()
        seconds, done, errors = drain(container, slug, workers)
        return {"rate": done / seconds if seconds else 0.0, "seconds": seconds, "done": done, "errors": errors,
                "cpu": (time.process_time() - client0) / seconds, "pg_cpu": cpu_delta(pg0, postgres_cpu()) / seconds}
    finally:
        container.close()


# -- phase 3: doorbell latency -----------------------------------------------------------


def doorbell(server: Server, endpoint: dict[str, Any], token: str, secret: str, rate: float,
             seconds: float) -> dict[str, Any]:
    url = f"http://127.0.0.1:{server.port}/mcp/{endpoint['slug']}"
    body = fixture(FIXTURE)
    headers = {"Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench", "X-GitHub-Event": "issues",
               "X-GitHub-Hook-ID": "424242", "Connection": "keep-alive", **sign("github", secret, body)}
    path = f"/webhooks/w/{token}"
    listener = ChannelListener()
    sent: dict[str, float] = {}  # todo id -> perf_counter just before its POST
    post_latency: list[float] = []
    statuses: Counter = Counter()
    failures: list[str] = []
    lag = [0.0]

    def post_one(conn: http.client.HTTPConnection) -> tuple[str | None, float, http.client.HTTPConnection]:
        h = dict(headers)
        h["X-GitHub-Delivery"] = str(uuid.uuid4())
        started = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers=h)
            response = conn.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as error:
            failures.append(f"{type(error).__name__}: {error}")
            conn.close()
            return None, started, http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        post_latency.append(time.perf_counter() - started)
        statuses[response.status] += 1
        if response.status != 202:
            failures.append(f"HTTP {response.status}: {answer[:200]!r}")
            return None, started, conn
        doc = json.loads(answer)
        if doc.get("created") != 1:
            failures.append(f"202 without a new todo: {answer[:200]!r}")
        return doc.get("id"), started, conn

    def sender() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            n = int(round(rate * seconds))
            t0 = time.perf_counter()
            for i in range(n):
                due = t0 + i / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                else:
                    lag[0] = max(lag[0], -wait)
                todo_id, started, conn = post_one(conn)
                if todo_id:
                    sent[todo_id] = started
        finally:
            conn.close()

    out: dict[str, Any] = {}

    async def scenario() -> None:
        async with AsyncExitStack() as stack:
            await open_session(stack, url, endpoint["credential"], listener)
            # warm-up: one delivery whose ring proves the GET stream is open and registered (not measured)
            with anyio.fail_after(10):
                while True:
                    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                    warm_id, _, conn = await anyio.to_thread.run_sync(post_one, conn)
                    conn.close()
                    with anyio.move_on_after(1.0):
                        while not any(t == warm_id for t, _ in listener.arrivals):
                            await anyio.sleep(0.01)
                    if any(t == warm_id for t, _ in listener.arrivals):
                        break
            listener.arrivals.clear()
            statuses.clear()
            post_latency.clear()
            cpu0, pg0 = server.cpu_seconds(), postgres_cpu()
            started = time.perf_counter()
            await anyio.to_thread.run_sync(sender)
            out["send_seconds"] = time.perf_counter() - started
            # wait for the stragglers (up to 3 s), then 1 s more to see any duplicate ring
            with anyio.move_on_after(3.0):
                while len({t for t, _ in listener.arrivals} & sent.keys()) < len(sent):
                    await anyio.sleep(0.02)
            await anyio.sleep(1.0)
            out["server_cpu"] = (server.cpu_seconds() - cpu0) / out["send_seconds"]
            out["pg_cpu"] = cpu_delta(pg0, postgres_cpu()) / out["send_seconds"]

    anyio.run(scenario)
    arrivals = list(listener.arrivals)
    per_todo = Counter(t for t, _ in arrivals)
    first: dict[str, float] = {}
    for todo_id, at in arrivals:
        first.setdefault(todo_id, at)
    latencies = sorted(first[t] - sent[t] for t in sent if t in first)
    post_latency.sort()
    out.update(
        posted=len(sent), statuses=statuses, failures=failures, rang=len(latencies),
        once=sum(1 for t in sent if per_todo[t] == 1), more=sum(1 for t in sent if per_todo[t] > 1),
        never=sum(1 for t in sent if per_todo[t] == 0), foreign=sum(1 for t in per_todo if t not in sent),
        rings=len(arrivals),
        p50=percentile(latencies, 0.50), p99=percentile(latencies, 0.99),
        max=latencies[-1] if latencies else 0.0, min=latencies[0] if latencies else 0.0,
        post_p50=percentile(post_latency, 0.50), post_p99=percentile(post_latency, 0.99), lag=lag[0],
    )
    return out


# -- main --------------------------------------------------------------------------------


def drain_line(tag: str, result: dict[str, Any]) -> str:
    return (f"{tag} {result['rate']:8.1f} todos/s ({result['done']} in {result['seconds']:.2f}s; {result['calls']} tool"
            f" calls; server cpu {result['cpu_per_call'] * 1000:.2f} ms/call, {result['server_cpu']:.0%} of a core;"
            f" postgres {result['pg_cpu']:.0%}; clients {result['client_cpu']:.0%}; load {load()})")


def load() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--todos", type=int, default=1000, help="todos to drain in each drain round (default 1000)")
    parser.add_argument("--sessions", type=int, default=8, help="MCP sessions / app worker threads (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of mcp / sdk floor / app (default 3)")
    parser.add_argument("--rate", type=float, default=50.0, help="doorbell deliveries per second (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="doorbell sending seconds (default 10)")
    parser.add_argument("--pg-url", default=ADMIN_URL, help=f"admin URL used to create databases (default {ADMIN_URL})")
    parser.add_argument("--quick", action="store_true", help="about a minute: 300 todos, 2 rounds, 4 s of deliveries")
    args = parser.parse_args()
    if args.quick:
        args.todos, args.seconds, args.rounds = min(args.todos, 300), min(args.seconds, 4.0), min(args.rounds, 2)

    dbs = Databases(args.pg_url)
    tmp = tempfile.TemporaryDirectory(prefix="sb-mcp-bench-")
    servers: list[Server] = []
    total_started = time.perf_counter()
    log(f"mcp drain bench: {args.todos} todos, {args.sessions} sessions/threads, {args.rounds} rounds; doorbell"
        f" {args.rate:g}/s for {args.seconds:g}s; run id {dbs.run_id}")
    pg = pg_settings(args.pg_url)
    log("postgres: " + ", ".join(f"{k}={v}" for k, v in sorted(pg.items())))
    log("machine: %d cores, load average %s (clients, servers and PostgreSQL share them)" % (os.cpu_count() or 0, load()))
    mcps: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    apps: list[dict[str, Any]] = []
    bell: dict[str, Any] = {}
    try:
        url = dbs.create("mcp")
        data_dir = os.path.join(tmp.name, "serve")
        os.makedirs(data_dir)
        setup = setup_server_db(url, data_dir)
        server = switchboard_server("switchboard-mcp", url, data_dir)
        servers.append(server.start())
        floor_dir = os.path.join(tmp.name, "floor")
        os.makedirs(floor_dir)
        floor = sdk_floor_server("sdk-floor", floor_dir, setup["claimed"], setup["completed"])
        servers.append(floor.start())
        log(f"fixed answers of the SDK floor: claim_next {len(json.dumps(setup['claimed']))} bytes, complete"
            f" {len(json.dumps(setup['completed']))} bytes of JSON (Switchboard's own, from this run)")
        for r in range(args.rounds):
            pushed = push_round(url, data_dir, setup["drain"]["slug"], args.todos, start_at=1 + r * args.todos)
            refill(floor, args.todos)
            order = ("mcp", "floor") if r % 2 == 0 else ("floor", "mcp")
            for which in order:
                if which == "mcp":
                    mcps.append(mcp_drain(server, setup["drain"], args.sessions))
                    log(drain_line(f"[{r + 1}] mcp drain:  ", mcps[-1]) + f"; pushed {pushed:.0f}/s untimed")
                else:
                    floors.append(mcp_drain(floor, setup["drain"], args.sessions))
                    log(drain_line(f"[{r + 1}] sdk floor:  ", floors[-1]))
            app_url = dbs.create(f"app{r}")
            os.makedirs(os.path.join(tmp.name, f"app{r}"))
            apps.append(app_drain(app_url, os.path.join(tmp.name, f"app{r}"), args.todos, args.sessions))
            dbs.drop(app_url)
            app = apps[-1]
            log(f"[{r + 1}] app drain:   {app['rate']:8.1f} todos/s  ({app['done']} in {app['seconds']:.2f}s;"
                f" errors {len(app['errors'])}; cpu: this process {app['cpu']:.0%}, postgres {app['pg_cpu']:.0%};"
                f" load {load()})")
            for error in app["errors"][:3]:
                log(f"    error: {error!r}")
            log(f"    round {r + 1}: mcp/sdk-floor {mcps[-1]['rate'] / floors[-1]['rate']:.3f},"
                f" mcp/app {mcps[-1]['rate'] / app['rate']:.3f}")

        # doorbell, same server (nothing claimed; the drained endpoint has no sessions left)
        bell = doorbell(server, setup["bell"], setup["token"], setup["secret"], args.rate, args.seconds)
        log(f"[d] doorbell:    p50 {bell['p50'] * 1000:.1f} ms  p99 {bell['p99'] * 1000:.1f} ms"
            f"  max {bell['max'] * 1000:.1f} ms  min {bell['min'] * 1000:.1f} ms; {bell['rang']}/{bell['posted']}"
            f" todos rang (once {bell['once']}, more than once {bell['more']}, never {bell['never']};"
            f" rings {bell['rings']}, foreign {bell['foreign']}); load {load()}")
        log(f"    POST->202 p50 {bell['post_p50'] * 1000:.1f} ms p99 {bell['post_p99'] * 1000:.1f} ms; statuses"
            f" {dict(bell['statuses'])}; sent over {bell['send_seconds']:.2f}s (worst pacing lag"
            f" {bell['lag'] * 1000:.1f} ms); cpu: server {bell['server_cpu']:.0%}, postgres {bell['pg_cpu']:.0%}")
        for failure in bell["failures"][:5]:
            log(f"    ! {failure}")
    finally:
        for server in servers:
            try:
                server.stop()
            except Exception as error:  # noqa: BLE001 - still drop the databases
                print(f"  ! could not stop {server.label}: {error}", file=sys.stderr)
        dbs.drop_all()
        tmp.cleanup()

    log("\n================ SUMMARY ================")
    log(f"workload: {args.todos} todos per round, {args.sessions} sessions/threads, claim_next + complete until"
        f" empty, {len(mcps)} rounds; PostgreSQL {pg.get('server_version', '?')}; {os.cpu_count()} cores")
    if mcps and floors and apps:
        rounds = list(zip(mcps, floors, apps))
        floor_ratio = median([m["rate"] / f["rate"] for m, f, _ in rounds])
        app_ratio = median([m["rate"] / a["rate"] for m, _, a in rounds])
        log(f"mcp (switchboard serve):   {median([m['rate'] for m in mcps]):8.1f} todos/s median;"
            f" server cpu {median([m['cpu_per_call'] for m in mcps]) * 1000:.2f} ms per tool call")
        log(f"sdk floor (bare SDK):      {median([f['rate'] for f in floors]):8.1f} todos/s median;"
            f" server cpu {median([f['cpu_per_call'] for f in floors]) * 1000:.2f} ms per tool call")
        log(f"app layer (in-process):    {median([a['rate'] for a in apps]):8.1f} todos/s median")
        log(f"ratio mcp/sdk-floor = {floor_ratio:.3f}  (median of the rounds' ratios; target >= 0.8:"
            f" {'MEETS' if floor_ratio >= 0.8 else 'MISSES'})")
        log(f"ratio mcp/app = {app_ratio:.3f}  (median of the rounds' ratios)")
    if bell:
        verdict = "MEETS" if bell["p99"] < 0.050 else "MISSES"
        log(f"doorbell: {bell['posted']} deliveries at {args.rate:g}/s; rang {bell['rang']}/{bell['posted']}"
            f" (exactly once {bell['once']}, duplicates {bell['more']}, never {bell['never']});"
            f" latency p50 {bell['p50'] * 1000:.1f} ms, p99 {bell['p99'] * 1000:.1f} ms, max {bell['max'] * 1000:.1f} ms"
            f" (target p99 < 50 ms: {verdict})")
    log(f"total wall time: {time.perf_counter() - total_started:.0f}s; load average at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
