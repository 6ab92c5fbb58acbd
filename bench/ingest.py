"""Webhook ingest throughput over real HTTP: `switchboard serve` against a bare Litestar app.

Run:  .venv/bin/python bench/ingest.py [--quick] [--seconds 8] [--senders 8] [--rounds 3]
                                       [--pg-url URL] [--profile DIR | --no-profile] [--with-rule]
                                       [--no-durable] [--no-floor]

Every PostgreSQL database used here is created fresh on the admin URL (`bench_<run id>_...`)
and dropped at the end, even on failure; every server started here is stopped in `finally`.
Phases, all in one run:

1. Switchboard on PostgreSQL: a fresh database and data dir; one endpoint and one GitHub
   webhook created in-process (`interfaces.bootstrap.build`), then `switchboard serve` as a
   subprocess on a free port with SWITCHBOARD_INGEST_RATE=0. S sender threads, each with its
   own keep-alive `http.client` connection, POST the signed GitHub `issues` delivery
   (tests/fixtures/github_issues_opened.json, raw bytes, ~10.5 KB) with a unique
   X-GitHub-Delivery each, so every delivery mints a todo (checked: the 202 says `"created":1`
   and the log holds as many TodoOpened events). After a warm-up, deliveries/s and p50/p99
   latency are measured over a fixed window. Per delivery, from pg_stat_database/pg_stat_wal:
   PostgreSQL transactions, rows, WAL, fsyncs, and the writer's group-commit size.
2. Baseline: a bare Litestar app (one route that reads the body and answers 202) under uvicorn
   in a subprocess with uvicorn's defaults, as `serve` uses them; same senders, same requests.
   Unless `--no-durable`, a second reference: the same app whose route first INSERTs the body
   into PostgreSQL (an async psycopg pool of 8, autocommit, synchronous commit) -- the floor of
   any durable queue on this database, which the target (against the bare route) leaves out.
   Unless `--no-floor`, a third: the contract floor (FLOOR_APP), the least any implementation of
   CONTRACT §4 does per delivery -- verify the signature, parse the JSON, one statement storing
   the delivery, its idempotency key and one todo -- generous on purpose (secret in memory,
   payload once, no event log, rules or read models). Each delivery commits on its own, as
   Switchboard's 202 needs; a design that shared commits between deliveries could save part of
   that commit's cost, nothing else.
3. Phases 1 and 2 alternate `--rounds` times (switchboard, bare, switchboard, bare, …); each
   ratio, the best and the median.
4. The same Switchboard measurement on SQLite (fresh file in its own data dir).
5. `--with-rule`: the PostgreSQL measurement again with one jq rule on the webhook (the rule
   engine's worker-process round trip on every delivery).
6. Unless `--no-profile`: one more, unmeasured Switchboard/PostgreSQL run under two py-spy
   samplers (`record --format raw --threads`, one with `--idle` for wall time, one with `--gil`
   for where the process's Python runs); a summary by thread, ingest stage and function.
   `--profile DIR` keeps the raw files.

Figures are for THIS machine while it runs: the senders, the server and PostgreSQL share its
cores (and so does anything else running), so each run also prints the CPU of the server
process, of all postgres processes, of the senders, and how busy the whole machine was.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from application.service import Caller  # noqa: E402
from bench.claim_complete import Databases, log, pg_settings  # noqa: E402
from interfaces.bootstrap import build  # noqa: E402
from interfaces.http.server import HTTP_STACK  # noqa: E402
from interfaces.settings import Settings  # noqa: E402
from tests.fixtures import fixture, sign  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
VENV_BIN = Path(sys.executable).parent
SWITCHBOARD = str(VENV_BIN / "switchboard")
# serve on PostgreSQL needs an explicit key, the same for the setup and the server (CONTRACT §12)
BENCH_SECRET_KEY = "be" * 32
PY_SPY = str(VENV_BIN / "py-spy")
FIXTURE = "github_issues_opened.json"
PROFILE_RATE = 150  # Hz, per sampler
QUEUE = "inbox"
REFERENCE_SECRET = "whsec_" + "0" * 64  # the references' senders sign with it; only the floor checks
RULE = {"rules": [{"id": "issues", "expr": '.kind == "issues" and .payload.action == "opened"',
                   "action": {"queue": QUEUE}}]}

BARE_APP = '''\
from litestar import Litestar, MediaType, Request, Response, get, post


@post("/webhooks/w/{token:str}", status_code=202, media_type=MediaType.JSON, request_max_body_size=None)
async def ingest(request: Request, token: str) -> Response:
    body = await request.body()
    return Response({"received": len(body)}, status_code=202, media_type=MediaType.JSON)


@get("/healthz", media_type=MediaType.TEXT)
async def healthz() -> str:
    return "ok"


app = Litestar(route_handlers=[ingest, healthz], openapi_config=None)
'''

# The two durable references share one frame: a pool of 8 autocommit connections opened with
# the app (creating the app's tables), the route, and /healthz. Each fills in its imports, tables and route.
POOLED_APP = """\
{stdlib}import os

from litestar import Litestar, MediaType, Request, Response, get, post
{packages}from psycopg_pool import AsyncConnectionPool

pool = AsyncConnectionPool(os.environ["REFERENCE_DB_URL"], min_size=8, max_size=8, open=False,
                           kwargs={{"autocommit": True}})
TABLES = {tables!r}


async def open_pool() -> None:
    await pool.open(wait=True)
    async with pool.connection() as conn:
        for table in TABLES:
            await conn.execute(table)


async def close_pool() -> None:
    await pool.close()

{route}

@get("/healthz", media_type=MediaType.TEXT)
async def healthz() -> str:
    return "ok"


app = Litestar(route_handlers=[ingest, healthz], on_startup=[open_pool], on_shutdown=[close_pool],
               openapi_config=None)
"""

# The floor of any durable queue: one INSERT of the body per delivery, nothing verified or routed.
DURABLE_APP = POOLED_APP.format(
    stdlib="", packages="",
    tables=("CREATE TABLE IF NOT EXISTS raw_deliveries"
            " (id BIGSERIAL PRIMARY KEY, token TEXT NOT NULL, body BYTEA NOT NULL)",),
    route="""
@post("/webhooks/w/{token:str}", status_code=202, media_type=MediaType.JSON, request_max_body_size=None)
async def ingest(request: Request, token: str) -> Response:
    body = await request.body()
    async with pool.connection() as conn:
        cursor = await conn.execute("INSERT INTO raw_deliveries (token, body) VALUES (%s, %b) RETURNING id",
                                    (token, body))
        (row_id,) = await cursor.fetchone()
    return Response({"id": row_id}, status_code=202, media_type=MediaType.JSON)
""")

# The least an implementation of CONTRACT §4 does per delivery when each delivery commits on its
# own, written as directly as one can: verify the GitHub signature, parse the JSON, and in ONE statement (one transaction,
# synchronous commit) store the delivery, claim its idempotency key and store one todo that
# points at the delivery's body. It is generous on purpose, so it is a floor and not a rival:
# the webhook's secret sits in memory (no read, no decryption, no rotation check), the payload
# is stored once, and there is no event log, no routing rules, no board, no read models.
FLOOR_APP = POOLED_APP.format(
    stdlib="import hashlib\nimport hmac\nimport json\n", packages="from psycopg.types.json import Jsonb\n",
    tables=("CREATE TABLE IF NOT EXISTS floor_deliveries (id BIGSERIAL PRIMARY KEY,"
            " token TEXT NOT NULL, headers JSONB NOT NULL, body BYTEA NOT NULL)",
            "CREATE TABLE IF NOT EXISTS floor_keys (token TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (token, key))",
            "CREATE TABLE IF NOT EXISTS floor_todos (id BIGSERIAL PRIMARY KEY, delivery_id BIGINT NOT NULL,"
            " queue TEXT NOT NULL, title TEXT NOT NULL, state TEXT NOT NULL)"),
    route="""
SECRET = os.environ["FLOOR_SECRET"].encode()
STORE = (
    "WITH k AS (INSERT INTO floor_keys (token, key) VALUES (%(token)s, %(key)s)"
    "           ON CONFLICT DO NOTHING RETURNING key),"
    " d AS (INSERT INTO floor_deliveries (token, headers, body) VALUES (%(token)s, %(headers)s, %(body)b)"
    "       RETURNING id),"
    " t AS (INSERT INTO floor_todos (delivery_id, queue, title, state) SELECT d.id, 'inbox', %(title)s, 'pending'"
    "       FROM d, k RETURNING id)"
    " SELECT (SELECT id FROM d), (SELECT id FROM t)"
)


@post("/webhooks/w/{token:str}", status_code=202, media_type=MediaType.JSON, request_max_body_size=None)
async def ingest(request: Request, token: str) -> Response:
    body = await request.body()
    given = request.headers.get("x-hub-signature-256", "")
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(given, expected):
        return Response({"error": "signature verification failed", "code": "unauthorized"}, status_code=401)
    payload = json.loads(body)
    title = str((payload.get("issue") or {}).get("title", ""))[:200]
    headers = {k: v for k, v in request.headers.items() if k != "x-hub-signature-256"}
    key = "github:" + request.headers.get("x-github-delivery", "")
    async with pool.connection() as conn:
        cursor = await conn.execute(STORE, {"token": token, "key": key, "headers": Jsonb(headers), "body": body,
                                            "title": title})
        delivery_id, todo_id = await cursor.fetchone()
    return Response({"delivery": delivery_id, "todo": todo_id, "created": int(todo_id is not None)},
                    status_code=202, media_type=MediaType.JSON)
""")


# -- processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Server:
    """A server subprocess; output goes to files in its log dir."""

    label: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    port: int
    proc: subprocess.Popen | None = None
    out_path: str = ""

    def start(self, timeout: float = 30.0) -> Server:
        self.out_path = os.path.join(self.cwd, f"{self.label}.log")
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.proc.returncode}:\n{self.output()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/healthz")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.label} did not answer /healthz within {timeout:.0f}s:\n{self.output()}")

    def output(self) -> str:
        try:
            return Path(self.out_path).read_text()[-4000:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process and its live descendants."""
        return sum(self.cpu_split())

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds of the server process itself, and of its live descendants (the projector
        process, the jq rule workers)."""
        if self.proc is None:
            return 0.0, 0.0
        processes = _processes()
        tree, grew = {self.proc.pid}, True
        while grew:
            grew = False
            for pid, ppid, _, _ in processes:
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        own = sum(cpu for pid, _, cpu, _ in processes if pid == self.proc.pid)
        return own, sum(cpu for pid, _, cpu, _ in processes if pid in tree and pid != self.proc.pid)

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        # the rule engine's worker processes die with the server; make sure (same session)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _processes() -> list[tuple[int, int, float, str]]:
    """(pid, parent pid, user + system CPU seconds, name) of every process."""
    tick, found = os.sysconf("SC_CLK_TCK"), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:].split()
        found.append((int(entry.name), int(rest[1]), (int(rest[11]) + int(rest[12])) / tick, name))
    return found


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of each `postgres` process of this machine (the whole cluster), by pid."""
    return {pid: cpu for pid, _, cpu, name in _processes() if name == "postgres" or name.startswith("postgres:")}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used in between by the processes alive at the end (one that exited is not counted)."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


# -- setup -------------------------------------------------------------------------------


def setup_switchboard(database_url: str, data_dir: str, *, with_rule: bool) -> tuple[str, str]:
    """Admin, one endpoint, one GitHub webhook (and its rule); returns (token, signing secret)."""
    container = build(Settings(database_url=database_url, data_dir=data_dir, secret_key=BENCH_SECRET_KEY))
    try:
        cli = Caller.cli()
        container.app.ensure_admin()
        slug = container.app.vend("ingest-bench", queues=[QUEUE], caller=cli)["slug"]
        hook = container.webhooks.create(caller=cli, endpoint=slug, source_type="github", target_queue=QUEUE)
        if with_rule:
            container.webhooks.set_rules(hook["webhook_id"], RULE, caller=cli)
        return hook["ingest_url"].rsplit("/", 1)[1], hook["signing_secret"]
    finally:
        container.close()


def switchboard_server(label: str, database_url: str, data_dir: str) -> Server:
    port = free_port()
    env = clean_env(SWITCHBOARD_DATABASE_URL=database_url, SWITCHBOARD_DATA_DIR=data_dir,
                    SWITCHBOARD_INGEST_RATE="0", SWITCHBOARD_SECRET_KEY=BENCH_SECRET_KEY)
    return Server(label, [SWITCHBOARD, "serve", "--port", str(port)], env, data_dir, port)


def stack_args() -> list[str]:
    """uvicorn's options for the HTTP stack `serve` runs on, so every reference runs on it too."""
    return ["--http", HTTP_STACK["http"], "--loop", HTTP_STACK["loop"]]


def bare_server(label: str, app_dir: str) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "bare_app:app", "--app-dir", app_dir, "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *stack_args()]
    return Server(label, argv, clean_env(), app_dir, port)


def pooled_server(label: str, app_dir: str, module: str, database_url: str) -> Server:
    """One of the references built on POOLED_APP (`durable_app`, `floor_app`) on its own database."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", f"{module}:app", "--app-dir", app_dir, "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *stack_args()]
    return Server(label, argv, clean_env(REFERENCE_DB_URL=database_url, FLOOR_SECRET=REFERENCE_SECRET), app_dir, port)


def pg_counters(database_url: str) -> dict[str, float]:
    """This database's transactions and rows, and the cluster's WAL (others may write too)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        xact, inserted, updated, fetched = conn.execute(
            "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, tup_fetched FROM pg_stat_database"
            " WHERE datname = current_database()").fetchone()
        wal_bytes, wal_records, wal_syncs = conn.execute(
            "SELECT wal_bytes, wal_records, wal_sync FROM pg_stat_wal").fetchone()
    return {"xact": xact, "inserted": inserted, "updated": updated, "fetched": fetched,
            "wal_bytes": float(wal_bytes), "wal_records": wal_records, "wal_syncs": wal_syncs}


def writer_batches(database_url: str) -> tuple[int, int]:
    """(DeliveryAccepted events, distinct transactions that wrote them): the writer's group commit."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*), count(DISTINCT xmin::text) FROM stored_events WHERE topic = 'DeliveryAccepted'"
        ).fetchone()


def todos_opened(database_url: str) -> int:
    """TodoOpened events in the store (each accepted delivery here must have minted one)."""
    sql = "SELECT count(*) FROM stored_events WHERE topic LIKE '%TodoOpened%'"
    if database_url.startswith("sqlite:///"):
        import sqlite3
        conn = sqlite3.connect(database_url[len("sqlite:///"):])
        try:
            return conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


# -- load --------------------------------------------------------------------------------


@dataclass
class Load:
    label: str
    rate: float = 0.0
    count: int = 0
    p50: float = 0.0
    p99: float = 0.0
    mean: float = 0.0
    seconds: float = 0.0
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    minted: int = 0  # 202 answers in the window that said "created":1
    minted_total: int = 0  # the same over the whole run (warm-up and tail included)
    server_cpu: float = 0.0  # share of one core, the server and its child processes
    children_cpu: float = 0.0  # share of one core, the server's child processes alone
    client_cpu: float = 0.0  # share of one core (this process: the sender threads)
    machine: float = 0.0  # share of all cores busy
    postgres_cpu: float = 0.0  # share of one core, all postgres processes
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        bad = sum(n for s, n in self.statuses.items() if s != 202) + len(self.failures)
        per = 1000.0 * self.seconds / self.count if self.count else 0.0
        return (f"{self.rate:8.1f} deliveries/s  p50 {self.p50 * 1000:6.2f} ms  p99 {self.p99 * 1000:6.2f} ms"
                f"  ({self.count} in {self.seconds:.1f}s; non-202/errors {bad};"
                f" cpu: server {self.server_cpu:.0%} (children {self.children_cpu:.0%}) postgres {self.postgres_cpu:.0%} senders {self.client_cpu:.0%}"
                f" machine {self.machine:.0%} of {os.cpu_count()} cores; cpu ms/delivery: server {self.server_cpu * per:.2f}"
                f" (children {self.children_cpu * per:.2f})"
                f" postgres {self.postgres_cpu * per:.2f} senders {self.client_cpu * per:.2f})")


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def drive(label: str, server: Server | list[Server], token: str, secret: str, body: bytes, *, senders: int,
          warmup: float, seconds: float, on_window: Callable[[], None] | None = None) -> Load:
    """`senders` threads on keep-alive connections for warmup + seconds; stats over the last `seconds`.
    Given several servers (processes on one database), sender i sends to server i mod n."""
    servers = server if isinstance(server, list) else [server]
    path = f"/webhooks/w/{token}"
    base_headers = {
        "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/bench", "X-GitHub-Event": "issues",
        "X-GitHub-Hook-ID": "424242", "Connection": "keep-alive", **sign("github", secret, body),
    }
    stop = threading.Event()
    window = [0.0, 0.0]
    per_thread: list[list[float]] = [[] for _ in range(senders)]
    statuses: list[Counter] = [Counter() for _ in range(senders)]
    minted = [0] * senders
    minted_total = [0] * senders
    sent = [0] * senders
    failures: list[str] = []
    barrier = threading.Barrier(senders + 1)

    def cpu_split() -> tuple[float, float]:
        splits = [s.cpu_split() for s in servers]
        return sum(own for own, _ in splits), sum(children for _, children in splits)

    def sender(i: int) -> None:
        port = servers[i % len(servers)].port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        latencies, counts = per_thread[i], statuses[i]
        perf = time.perf_counter
        try:
            barrier.wait()
            while not stop.is_set():
                headers = dict(base_headers)
                headers["X-GitHub-Delivery"] = str(uuid.uuid4())
                started = perf()
                try:
                    conn.request("POST", path, body=body, headers=headers)
                    response = conn.getresponse()
                    answer = response.read()
                    status = response.status
                except (OSError, http.client.HTTPException) as error:
                    failures.append(f"{type(error).__name__}: {error}")
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    continue
                ended = perf()
                sent[i] += 1
                created = status == 202 and b'"created":1' in answer
                minted_total[i] += created
                if started >= window[0] and ended <= window[1]:
                    latencies.append(ended - started)
                    counts[status] += 1
                    minted[i] += created
                elif status != 202:
                    counts[status] += 1
                if status != 202 and len(failures) < 20:
                    failures.append(f"HTTP {status}: {answer[:200]!r}")
        finally:
            conn.close()

    threads = [threading.Thread(target=sender, args=(i,), name=f"sender-{i}", daemon=True) for i in range(senders)]
    for t in threads:
        t.start()
    now = time.perf_counter()
    window[0], window[1] = now + warmup, now + warmup + seconds
    barrier.wait()
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    if on_window is not None:
        on_window()
    cpu0, client0, busy0, pg0 = cpu_split(), time.process_time(), machine_busy(), postgres_cpu()
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    cpu1, client1, busy1, pg1 = cpu_split(), time.process_time(), machine_busy(), postgres_cpu()
    stop.set()
    for t in threads:
        t.join(timeout=60)

    latencies = sorted(x for per in per_thread for x in per)
    result = Load(label, seconds=seconds)
    result.count = sum(c[202] for c in statuses)
    result.rate = result.count / seconds
    result.p50, result.p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    result.mean = statistics.fmean(latencies) if latencies else 0.0
    result.sent = sum(sent)
    for c in statuses:
        result.statuses.update(c)
    result.failures = failures
    result.minted = sum(minted)
    result.minted_total = sum(minted_total)
    result.server_cpu = (sum(cpu1) - sum(cpu0)) / seconds
    result.children_cpu = (cpu1[1] - cpu0[1]) / seconds
    result.client_cpu = (client1 - client0) / seconds
    result.postgres_cpu = cpu_delta(pg0, pg1) / seconds
    result.machine = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) if busy1[1] > busy0[1] else 0.0
    return result


# -- phases ------------------------------------------------------------------------------


def switchboard_phase(label: str, database_url: str, data_dir: str, body: bytes, args: argparse.Namespace,
                      servers: list[Server], *, with_rule: bool = False,
                      profile: tuple[str, float] | None = None) -> Load:
    os.makedirs(data_dir, exist_ok=True)
    token, secret = setup_switchboard(database_url, data_dir, with_rule=with_rule)
    server = switchboard_server(label, database_url, data_dir)
    servers.append(server)
    server.start()
    spies: list[subprocess.Popen] = []
    try:
        def start_profilers() -> None:
            # two samplers from the start of the measured window: wall time of every thread
            # (--idle), and only the thread holding the GIL (--gil: where the process's Python runs)
            out_file, duration = profile
            for out, flags in ((out_file + ".wall", ["--idle"]), (out_file + ".cpu", ["--gil"])):
                spies.append(subprocess.Popen(
                    [PY_SPY, "record", "--pid", str(server.proc.pid), "--format", "raw", "--output", out,
                     "--duration", str(max(1, round(duration))), "--rate", str(PROFILE_RATE), "--threads",
                     "--nonblocking", *flags],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                ))

        before = todos_opened(database_url)
        postgres = not database_url.startswith("sqlite:")
        counters0 = pg_counters(database_url) if postgres else None
        result = drive(label, server, token, secret, body, senders=args.senders, warmup=args.warmup,
                       seconds=args.seconds if profile is None else round(profile[1]),
                       on_window=start_profilers if profile is not None else None)
        for spy in spies:
            try:
                _, err = spy.communicate(timeout=30)
                if spy.returncode != 0:
                    result.failures.append(f"py-spy exited {spy.returncode}: {err.strip()[-500:]}")
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.communicate()
                result.failures.append("py-spy did not finish")
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.kill()
                spy.wait()
        server.stop()
    stored = todos_opened(database_url) - before
    if result.minted != result.count:
        result.failures.append(f"{result.count - result.minted} of {result.count} 202 answers did not mint a todo")
    if stored != result.minted_total:
        result.failures.append(f"{stored} TodoOpened events stored for {result.minted_total} '\"created\":1' answers")
    if counters0 is not None and stored:
        time.sleep(0.2)  # the server's backends have exited and flushed their statistics
        counters1 = pg_counters(database_url)
        d = {k: counters1[k] - counters0[k] for k in counters0}
        deliveries, commits = writer_batches(database_url)
        result.notes.append(
            f"per delivery: {d['xact'] / stored:.1f} PG transactions (autocommit reads count one each),"
            f" {d['inserted'] / stored:.1f} rows inserted, {d['updated'] / stored:.1f} updated,"
            f" {d['wal_bytes'] / stored / 1024:.1f} KiB WAL, {d['wal_syncs'] / stored:.2f} WAL fsyncs (cluster-wide);"
            f" writer group commit: {deliveries / max(commits, 1):.1f} deliveries per transaction"
            f" ({deliveries} in {commits}), over all {stored} deliveries of the run")
    return result


def reference_phase(server: Server, body: bytes, args: argparse.Namespace, servers: list[Server]) -> Load:
    """The same load on a reference app (the bare route, the durable INSERT or the contract floor;
    only the floor checks the signature); it is started here and stopped in any case."""
    servers.append(server)
    server.start()
    try:
        return drive(server.label, server, "0" * 32, REFERENCE_SECRET, body, senders=args.senders,
                     warmup=args.warmup, seconds=args.seconds)
    finally:
        server.stop()


def pooled_phase(name: str, title: str, pair: tuple[Load, Load], r: int, app_dir: str, dbs: Databases,
                 body: bytes, args: argparse.Namespace, servers: list[Server]) -> Load:
    """Round r of a POOLED_APP reference (`{name}_app`), on a database of its own, dropped after;
    logged with its ratio to the round's bare route and Switchboard's ratio to it."""
    url = dbs.create(f"{name}{r}")
    try:
        load = reference_phase(pooled_server(f"{name}-{r}", app_dir, f"{name}_app", url), body, args, servers)
    finally:
        dbs.drop(url)
    if name == "floor" and load.minted != load.count:  # it answers "created":1 for each todo it stores
        load.failures.append(f"{load.count - load.minted} of {load.count} 202 answers did not store a todo")
    log(f"[round {r}] {title}: {load.line()}")
    report_problems(load)
    sb, bare = pair
    label = title.replace(" ", "-")
    log(f"[round {r}] ratio {label}/bare = {load.rate / bare.rate if bare.rate else 0.0:.3f};"
        f" switchboard-pg/{label} = {sb.rate / load.rate if load.rate else 0.0:.3f}")
    return load


FLOOR_TARGET = 0.6
"""Switchboard ÷ the contract floor that issue 16 asks for (the median of the rounds)."""


def summarize_reference(title: str, loads: list[Load], pairs: list[tuple[Load, Load]], what: str,
                        target: float | None = None) -> None:
    """A durable reference's rates over the rounds, its ratio to the bare route and Switchboard's to
    it (with `target`: whether the median meets it)."""
    if not loads:
        return
    rates = [load.rate for load in loads]
    log(f"{title} median {statistics.median(rates):8.1f}/s, best {max(rates):8.1f}/s"
        f" (p50 {statistics.median(load.p50 for load in loads) * 1000:.1f} ms)")
    of_bare = [load.rate / bare.rate for (_, bare), load in zip(pairs, loads) if bare.rate]
    ours = [sb.rate / load.rate for (sb, _), load in zip(pairs, loads) if load.rate]
    name = title.replace(" ", "-")
    if of_bare:
        log(f"ratio {name}/bare: best {max(of_bare):.3f}, median {statistics.median(of_bare):.3f}  ({what})")
    if ours:
        verdict = "" if target is None else \
            f"  (target: median >= {target}: {'MEETS' if statistics.median(ours) >= target else 'BELOW'})"
        log(f"ratio switchboard-pg/{name}: best {max(ours):.3f}, median {statistics.median(ours):.3f}{verdict}")


def report_problems(result: Load) -> None:
    for note in result.notes:
        log(f"    {note}")
    bad = {s: n for s, n in result.statuses.items() if s != 202}
    if bad:
        log(f"    ! statuses other than 202: {bad}")
    for failure in result.failures[:5]:
        log(f"    ! {failure}")


# -- profile summary ---------------------------------------------------------------------
#
# py-spy's raw format is one collapsed stack a line: "thread (tid): name;frame;frame… count",
# each frame "Qualified.function (path/file.py:line)", root first.


def parse_raw(path: str) -> list[tuple[str, list[str], list[str], int]]:
    """(thread name, [qualified function names], [their files], samples), root first."""
    samples = []
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        name = head.split(": ", 1)[1] if ": " in head else head
        funcs, files = [], []
        for frame in frames:
            func, _, where = frame.partition(" (")
            funcs.append(func)
            files.append(where.rsplit(":", 1)[0].rstrip(")"))
        samples.append((name, funcs, files, int(count)))
    return samples


def library_of(path: str) -> str:
    """Which code a leaf frame belongs to: a library, the stdlib, or Switchboard's own layers."""
    top = path.split("/", 1)[0]
    if top in ("application", "domain", "interfaces", "projections"):
        return f"switchboard {top}/"
    if "/" not in path or top in ("json", "uuid", "hmac", "hashlib", "threading", "queue", "concurrent",
                                  "asyncio", "base64", "contextlib", "dataclasses", "re", "copy", "selectors",
                                  "logging", "socket", "datetime", "enum", "typing", "functools", "collections"):
        return "python stdlib"
    return top


def role_of(name: str, frames: list[str]) -> str:
    if name == "switchboard-writer" or "Writer._loop" in frames:
        return "writer"
    if name.startswith("switchboard-ingest") or name == "AnyIO worker thread" or "WorkerThread.run" in frames:
        return "ingest workers (threads)"
    if name in ("switchboard-projections", "switchboard-scheduler"):
        return name.replace("switchboard-", "background: ")
    if name == "MainThread":
        return "event loop (asyncio; HTTP + Litestar, C frames invisible)"
    if name.startswith("pool-") or name.startswith("switchboard-prefetch"):
        return "psycopg pool / prefetch threads"
    return "other threads"


def state_of(frames: list[str]) -> str:
    """What the thread is doing at the sample: waiting on PostgreSQL, on a pooled connection, …"""
    leaf = frames[-1] if frames else ""
    if "WaitingClient.wait" in frames:
        return "wait: pool connection"
    if leaf in ("Connection.wait", "BaseConnection.wait") or (leaf.endswith(".wait") and any(
            f.startswith(("Cursor.", "BaseCursor.", "Connection.", "BasePipeline.", "Pipeline.")) for f in frames[-4:])):
        return "wait: PostgreSQL round trip"
    if leaf == "Pipeline._communicate":  # the append's pq pipeline (interfaces/store/pipeline.py) in select()
        return "wait: PostgreSQL round trip"
    if ("Future.result" in frames or "Outcome.result" in frames) and "SqlEventStore.run" in frames:
        return "wait: writer (store.run)"
    if leaf == "Writer._loop":  # SimpleQueue.get is C code: the writer waits for jobs
        return "idle / blocked"
    if leaf in ("Condition.wait", "Event.wait", "_wait_for_tstate_lock", "Queue.get", "SimpleQueue.get",
                "_worker", "Runner.run", "select", "EpollSelector.select", "sleep"):
        return "idle / blocked"
    return "python (on CPU or waiting for the GIL)"


# Ordered: the first stage whose frames all occur in the stack names the sample.
STAGES = {
    "ingest workers (threads)": [
        ("store.run: waiting for the writer's batch", ("Ingest.ingest", "SqlEventStore.run")),
        ("resolve: token -> sb_credentials query", ("Ingest.resolve", "SqlViews.subject_of_credential")),
        ("resolve: one read (webhook, endpoints, keys)", ("Ingest.resolve", "SqlEventStore.load_many")),
        ("resolve: other", ("Ingest.resolve",)),
        ("ingest: read what a stale guess missed", ("Ingest.ingest", "SqlEventStore.load_many")),
        ("rule engine evaluate (IPC)", ("Ingest.ingest", "JqRuleEngine.evaluate")),
        ("AES-GCM secret decrypt", ("Ingest.ingest", "AesGcmSecretBox.decrypt")),
        ("signature verify", ("Ingest.ingest", "verify_signature")),
        ("parse_payload_form (json.loads)", ("Ingest.ingest", "parse_payload_form")),
        ("rule_set_of", ("Ingest.ingest", "rule_set_of")),
        ("envelope / redact / title", ("Ingest.ingest", "envelope")),
        ("envelope / redact / title", ("Ingest.ingest", "redact_headers")),
        ("envelope / redact / title", ("Ingest.ingest", "derive_title")),
        ("ingest: other", ("Ingest.ingest",)),
        ("idle pool thread", ()),
    ],
    "writer": [
        ("commit: insert_events + inline projections (1 txn/batch)", ("Writer._commit",)),
        ("handler: load IdempotencyKey (miss -> query)", ("open_or_reuse", "Unit.get")),
        ("handler: load target Endpoint (not cached)", ("Recording.handler", "Unit.get")),
        ("handler: Todo.open / Delivery.accept (domain)", ("Recording.handler",)),
        ("announce to listeners", ("Writer._announce",)),
        ("waiting for jobs / linger", ("Writer._loop",)),
        ("other", ()),
    ],
    "background: projections": [
        ("read the log page", ("Projector.catch_up", "SqlEventStore.read_log_in")),
        ("apply + commit projection rows", ("Projector.catch_up",)),
        ("idle", ()),
    ],
}


def _stage(role: str, frames: list[str]) -> str | None:
    for label, needed in STAGES.get(role, ()):
        if all(f in frames for f in needed):
            return label
    return None


def summarize_profile(prefix: str, top: int, deliveries: int) -> None:
    """Prints where the server's time goes from the two py-spy raw files `<prefix>.wall/.cpu`."""
    wall, cpu = parse_raw(prefix + ".wall"), parse_raw(prefix + ".cpu")
    if not wall or not cpu:
        log(f"  (no samples in {prefix}.wall/.cpu)")
        return
    rate = float(PROFILE_RATE)
    per_delivery = 1000.0 / rate / max(1, deliveries)  # one sample -> ms per delivery

    # 1. wall time of each thread role, by state
    per_role: dict[str, Counter] = defaultdict(Counter)
    stage_wall: dict[str, Counter] = defaultdict(Counter)
    stage_states: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for name, frames, _, count in wall:
        role, state = role_of(name, frames), state_of(frames)
        per_role[role][state] += count
        label = _stage(role, frames)
        if label is not None:
            stage_wall[role][label] += count
            stage_states[(role, label)][state] += count
    states = ["python (on CPU or waiting for the GIL)", "wait: PostgreSQL round trip", "wait: pool connection",
              "wait: writer (store.run)", "idle / blocked"]
    heads = ["python/GIL", "PG round trip", "pool conn", "writer", "idle"]
    log(f"\n--- py-spy wall clock ({rate:.0f} Hz, --idle): each server thread role, share of its time by state ---")
    log(f"  {'role':58s} {'thread-s':>8s} " + " ".join(f"{h:>13s}" for h in heads))
    for role, counter in sorted(per_role.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(counter.values())
        log(f"  {role:58s} {n / rate:8.1f} " + " ".join(f"{counter[s] / n:13.0%}" for s in states))

    # 2. on-CPU samples: per role, per stage, per library, per leaf
    cpu_role: Counter = Counter()
    cpu_stage: dict[str, Counter] = defaultdict(Counter)
    cpu_lib: Counter = Counter()
    cpu_leaf: Counter = Counter()
    for name, frames, files, count in cpu:
        role = role_of(name, frames)
        cpu_role[role] += count
        label = _stage(role, frames)
        if label is not None:
            cpu_stage[role][label] += count
        cpu_lib[library_of(files[-1]) if files else "?"] += count
        cpu_leaf[f"{frames[-1]} ({files[-1]})" if frames else "?"] += count
    total = sum(cpu_role.values())

    for role in ("ingest workers (threads)", "writer", "background: projections"):
        stages = stage_wall.get(role)
        if not stages:
            continue
        busy = sum(c for label, c in stages.items() if not label.startswith(("idle", "waiting for jobs")))
        log(f"\n--- {role}: wall time by stage ({busy / rate:.1f} thread-s busy; ms/delivery = thread time"
            f" per delivery; gil = GIL-holding time in that stage per delivery) ---")
        for label, c in stages.most_common():
            if label.startswith("idle"):
                continue
            st = stage_states[(role, label)]
            split = ", ".join(f"{h} {st[s] / c:.0%}" for s, h in zip(states, heads) if st[s] / c >= 0.05)
            log(f"  {c / max(1, busy):6.1%} {c * per_delivery:6.2f} ms/dlv  gil {cpu_stage[role][label] * per_delivery:5.2f}"
                f" ms/dlv  {label:55s} [{split}]")

    log(f"\n--- GIL holder samples (py-spy --gil): the GIL was held {total / rate:.2f} s for {deliveries} deliveries"
        f" = {total * per_delivery:.2f} ms per delivery; by thread role ---")
    for role, c in cpu_role.most_common():
        log(f"  {c / total:6.1%} {c * per_delivery:6.2f} ms/dlv  {role}")
    log("--- GIL holder samples by the code of the innermost Python frame ---")
    for lib, c in cpu_lib.most_common(12):
        log(f"  {c / total:6.1%} {c * per_delivery:6.2f} ms/dlv  {lib}")
    log(f"--- GIL holder samples: top {top} innermost Python functions ---")
    for leaf, c in cpu_leaf.most_common(top):
        log(f"  {c / total:6.1%} {c * per_delivery:6.2f} ms/dlv  {leaf}")


# -- main --------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run (default 8)")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds before each window (default 1.5)")
    parser.add_argument("--senders", type=int, default=8, help="sender threads (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating switchboard/bare pairs (default 3)")
    parser.add_argument("--pg-url", default=ADMIN_URL, help=f"admin URL used to create databases (default {ADMIN_URL})")
    parser.add_argument("--skip-sqlite", action="store_true", help="skip the SQLite run")
    parser.add_argument("--profile", metavar="DIR", help="keep the py-spy raw profile in DIR (default: a temp dir)")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy run")
    parser.add_argument("--profile-seconds", type=float, default=8.0, help="seconds of the py-spy run (default 8)")
    parser.add_argument("--profile-top", type=int, default=25, help="rows of each profile table (default 25)")
    parser.add_argument("--with-rule", action="store_true",
                        help="also measure Switchboard/PostgreSQL with one jq rule (the rule engine's IPC)")
    parser.add_argument("--no-durable", action="store_true",
                        help="skip the durable-insert baseline (a Litestar route doing one INSERT per delivery)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the contract-floor baseline (verify, parse, one atomic INSERT of delivery+key+todo)")
    parser.add_argument("--quick", action="store_true",
                        help="under a minute: 2 rounds, 3 s windows, 1 s warm-up, 4 s profile")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.rounds = min(args.seconds, 3.0), min(args.warmup, 1.0), min(args.rounds, 2)
        args.profile_seconds = min(args.profile_seconds, 4.0)

    body = fixture(FIXTURE)
    dbs = Databases(args.pg_url)
    tmp = tempfile.TemporaryDirectory(prefix="sb-ingest-bench-")
    app_dir = os.path.join(tmp.name, "bare")
    os.makedirs(app_dir)
    Path(app_dir, "bare_app.py").write_text(BARE_APP)
    Path(app_dir, "durable_app.py").write_text(DURABLE_APP)
    Path(app_dir, "floor_app.py").write_text(FLOOR_APP)
    durables: list[Load] = []
    floors: list[Load] = []
    servers: list[Server] = []
    pairs: list[tuple[Load, Load]] = []
    extra: dict[str, Load] = {}
    profile_file = None
    total_started = time.perf_counter()

    log(f"ingest bench: {args.senders} senders, keep-alive http.client; body {FIXTURE} ({len(body)} bytes),"
        f" unique X-GitHub-Delivery each; {args.warmup:g}s warm-up + {args.seconds:g}s measured per run;"
        f" {args.rounds} round(s); run id {dbs.run_id}")
    pg = pg_settings(args.pg_url)
    log("postgres: " + ", ".join(f"{k}={v}" for k, v in sorted(pg.items())))
    log("machine: %d cores, load average %.2f %.2f %.2f (senders, server and PostgreSQL share them)"
        % (os.cpu_count() or 0, *os.getloadavg()))
    try:
        for r in range(1, args.rounds + 1):
            url = dbs.create(f"ingest{r}")
            sb = switchboard_phase(f"switchboard-pg-{r}", url, os.path.join(tmp.name, f"pg{r}"), body, args, servers)
            dbs.drop(url)
            log(f"[round {r}] switchboard/pg: {sb.line()}")
            report_problems(sb)
            bare = reference_phase(bare_server(f"bare-{r}", app_dir), body, args, servers)
            log(f"[round {r}] bare litestar:  {bare.line()}")
            report_problems(bare)
            ratio = sb.rate / bare.rate if bare.rate else 0.0
            log(f"[round {r}] ratio switchboard-pg/bare = {ratio:.3f}")
            pairs.append((sb, bare))
            if not args.no_durable:
                durables.append(pooled_phase("durable", "durable insert", (sb, bare), r, app_dir, dbs, body, args,
                                             servers))
            if not args.no_floor:
                floors.append(pooled_phase("floor", "contract floor", (sb, bare), r, app_dir, dbs, body, args, servers))

        if not args.skip_sqlite:
            data_dir = os.path.join(tmp.name, "sqlite")
            sq = switchboard_phase("switchboard-sqlite", f"sqlite:///{data_dir}/switchboard.db", data_dir, body,
                                   args, servers)
            log(f"switchboard/sqlite:        {sq.line()}")
            report_problems(sq)
            extra["sqlite"] = sq

        if args.with_rule:
            url = dbs.create("rule")
            rl = switchboard_phase("switchboard-pg-rule", url, os.path.join(tmp.name, "pg-rule"), body, args,
                                   servers, with_rule=True)
            dbs.drop(url)
            log(f"switchboard/pg + 1 jq rule: {rl.line()}")
            report_problems(rl)
            extra["rule"] = rl

        if not args.no_profile:
            profile_dir = args.profile or os.path.join(tmp.name, "profile")
            os.makedirs(profile_dir, exist_ok=True)
            profile_file = os.path.join(profile_dir, "switchboard-pg.raw")
            url = dbs.create("profile")
            pr = switchboard_phase("switchboard-pg-profiled", url, os.path.join(tmp.name, "pg-profile"), body, args,
                                   servers, profile=(profile_file, args.profile_seconds))
            dbs.drop(url)
            log(f"switchboard/pg under py-spy (not in the ratios): {pr.line()}")
            report_problems(pr)
            if os.path.exists(profile_file + ".wall") and os.path.exists(profile_file + ".cpu"):
                summarize_profile(profile_file, args.profile_top, pr.count)
                if args.profile:
                    log(f"raw profiles kept in {profile_file}.wall and .cpu")
            else:
                log("  ! py-spy wrote no profile")
    finally:
        for server in servers:
            try:
                server.stop()
            except Exception as error:  # noqa: BLE001 - keep stopping the others
                print(f"  ! could not stop {server.label}: {error}", file=sys.stderr)
        dbs.drop_all()
        tmp.cleanup()

    # summary
    log("\n================ SUMMARY ================")
    log(f"workload: {args.senders} keep-alive senders, POST {FIXTURE} ({len(body)} bytes) signed, unique delivery ids;"
        f" {args.seconds:g}s measured per run")
    ratios = []
    for i, (sb, bare) in enumerate(pairs, 1):
        ratio = sb.rate / bare.rate if bare.rate else 0.0
        ratios.append(ratio)
        log(f"round {i}: switchboard/pg {sb.rate:8.1f}/s (p50 {sb.p50 * 1000:.1f} ms, p99 {sb.p99 * 1000:.1f} ms)"
            f" | bare {bare.rate:8.1f}/s (p50 {bare.p50 * 1000:.1f} ms, p99 {bare.p99 * 1000:.1f} ms)"
            f" | ratio {ratio:.3f}")
    if pairs:
        sb_rates = [p[0].rate for p in pairs]
        bare_rates = [p[1].rate for p in pairs]
        log(f"switchboard/pg median {statistics.median(sb_rates):8.1f}/s, best {max(sb_rates):8.1f}/s")
        log(f"bare litestar  median {statistics.median(bare_rates):8.1f}/s, best {max(bare_rates):8.1f}/s")
        # issue 3 asked for >= 0.35 of the bare route; the contract floor itself does ~0.28 of it
        # (docs/adr/0013), so issue 16 set the target against that floor instead (below)
        log(f"ratio switchboard-pg/bare: best {max(ratios):.3f}, median {statistics.median(ratios):.3f}")
    summarize_reference("durable insert", durables, pairs, "one INSERT of the body per delivery, nothing verified or routed")
    summarize_reference("contract floor", floors, pairs,
                        "verify + parse + one atomic INSERT of delivery, key and todo: no event log, no read models",
                        target=FLOOR_TARGET)
    if "sqlite" in extra:
        sq = extra["sqlite"]
        bare_rates = [p[1].rate for p in pairs]
        if bare_rates:
            ref = statistics.median(bare_rates)
            log(f"switchboard/sqlite {sq.rate:8.1f}/s (p50 {sq.p50 * 1000:.1f} ms, p99 {sq.p99 * 1000:.1f} ms);"
                f" ratio sqlite/bare {sq.rate / ref:.3f} against the median bare run"
                f" ({sq.rate / max(bare_rates):.3f}..{sq.rate / min(bare_rates):.3f} against each)")
        else:
            log(f"switchboard/sqlite {sq.rate:8.1f}/s (p50 {sq.p50 * 1000:.1f} ms, p99 {sq.p99 * 1000:.1f} ms)")
    if "rule" in extra:
        rl = extra["rule"]
        ref = statistics.median([p[1].rate for p in pairs]) if pairs else 0.0
        log(f"switchboard/pg + 1 jq rule {rl.rate:8.1f}/s (p50 {rl.p50 * 1000:.1f} ms, p99 {rl.p99 * 1000:.1f} ms);"
            f" ratio to median bare {rl.rate / ref if ref else 0.0:.3f}")
    problems = sum(1 for load in [x for p in pairs for x in p] + durables + floors + list(extra.values())
                   if load.failures or any(s != 202 for s in load.statuses))
    log(f"runs with non-202 answers or errors: {problems}")
    log(f"total wall time: {time.perf_counter() - total_started:.0f}s; load average at the end %.2f %.2f %.2f"
        % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
