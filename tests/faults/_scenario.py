"""The fault scenarios of issue 11, run against a disposable cluster (tests/faults/_cluster.py) with
real `switchboard serve` processes and real clients (tests/faults/_load.py).

`run(name, cluster, root)` sets up one database, one or two servers, an endpoint and a GitHub
webhook, runs the load for `pre` seconds, applies the fault, runs `post` seconds more, stops the
load, and returns an `Outcome`: every answer, the fault's window, what the event log holds for
each answer (`Ledger`), `projections rebuild --verify`, and each server's stderr over the fault.
The tests (tests/faults/test_faults.py) assert on it; bench/faults.py measures it.
"""

from __future__ import annotations

import re
import secrets
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import psycopg

from interfaces.bootstrap import build
from interfaces.settings import Settings
from tests.e2e._support import SWITCHBOARD_SCRIPT, Result, Server
from tests.e2e._ingest import StackCli
from tests.faults._cluster import Cluster
from tests.faults._load import Answer, Load

OUTAGE = 2.0  # seconds the database stays stopped in `pg_restart`
TERMINATE_FOR = 2.0  # seconds of repeated pg_terminate_backend in `backends_killed`
TERMINATE_EVERY = 0.02
EXHAUST_FOR = 3.0  # seconds another client holds all but FEW_LEFT connections
FEW_LEFT = 2
KILL_CYCLES = 5


class FaultServer(Server):
    """`switchboard serve` that appends to its logs across restarts and can be killed with SIGKILL."""

    def start(self) -> FaultServer:
        with open(self.out_path, "a") as out, open(self.err_path, "a") as err:
            self.proc = subprocess.Popen(
                [SWITCHBOARD_SCRIPT, "serve", "--port", str(self.port)],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=self.env, cwd=self.logs,
            )
        return self

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stderr_size(self) -> int:
        return self.err_path.stat().st_size if self.err_path.exists() else 0

    def stderr_since(self, offset: int) -> str:
        with open(self.err_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")


class Deployment:
    """One database on the cluster (owned by its own ordinary role), its servers and CLI."""

    def __init__(self, cluster: Cluster, root: Path, **server_env: str) -> None:
        self.cluster = cluster
        self.root = root
        self.url, self.role = cluster.new_database()
        # the checks read as the superuser: its reserved slots keep them working when the servers'
        # role has used up the cluster (which is then the servers' finding, not the checks')
        self.check_url = cluster.url(self.role, "postgres")
        self.secret_key = secrets.token_hex(32)
        self.server_env = {"SWITCHBOARD_INGEST_RATE": "0", "SWITCHBOARD_SECRET_KEY": self.secret_key, **server_env}
        self.servers: list[FaultServer] = []
        self.data_dir = root / "var"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.cli: StackCli | None = None
        self.notes: dict[str, object] = {}  # what a fault measured of itself (shown with the outcome)

    def serve(self, name: str) -> FaultServer:
        server = FaultServer(self.data_dir, self.root, url=self.url, name=name, **self.server_env)
        server.env["SWITCHBOARD_BASE_URL"] = server.base
        self.servers.append(server)
        server.start().wait_healthy(timeout=30)
        if self.cli is None:
            self.cli = StackCli(self.url, self.data_dir, server.base, SWITCHBOARD_SECRET_KEY=self.secret_key)
        return server

    def setup(self) -> None:
        vend = self.cli.json("endpoint", "vend", "fault-agent", "--queue", "work")
        hook = self.cli.json("webhook", "create", "--endpoint", vend["slug"], "--source", "github", "--queue", "work")
        self.vend, self.hook = vend, hook

    def live_bases(self) -> list[str]:
        return [s.base for s in self.servers]

    def load(self, **options) -> Load:
        return Load(self.live_bases, ingest_path=urlparse(self.hook["ingest_url"]).path,
                    signing_secret=self.hook["signing_secret"], mcp_path=urlparse(self.vend["mcp_url"]).path,
                    credential=self.vend["credential"], **options)

    def wait_serving(self, timeout: float = 30) -> None:
        for server in self.servers:
            server.wait_healthy(timeout=timeout)

    def verify(self) -> Result:
        return self.cli.run("projections", "rebuild", "--verify", timeout=120,
                            env={"SWITCHBOARD_DATABASE_URL": self.check_url})

    def stop(self) -> dict[str, int | None]:
        return {s.out_path.stem: s.stop() for s in self.servers}


# -- the faults: each returns (began, ended) in time.monotonic() -----------------------------


def pg_restart(dep: Deployment) -> tuple[float, float]:
    """PostgreSQL stopped (`-m fast`: every session ended), down OUTAGE s, started again."""
    began = time.monotonic()
    dep.cluster.stop("fast")
    dep.notes["stopped_after"] = round(time.monotonic() - began, 2)
    time.sleep(OUTAGE)
    starting = threading.Thread(target=dep.cluster.start)  # pg_ctlcluster returns a while after
    starting.start()
    back = dep.cluster.wait_accepting()  # the fault ends when PostgreSQL accepts connections again
    starting.join()
    return began, back


def backends_killed(dep: Deployment) -> tuple[float, float]:
    """Every backend of the servers' role terminated, again and again, for TERMINATE_FOR s: the
    connections die mid-statement and mid-commit (the unknown-commit-outcome case)."""
    began = time.monotonic()
    dep.notes["killed"] = 0
    with psycopg.connect(dep.cluster.url(), autocommit=True) as admin:
        while time.monotonic() - began < TERMINATE_FOR:
            row = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE usename = %s", (dep.role,)).fetchone()
            dep.notes["killed"] += row[0]
            time.sleep(TERMINATE_EVERY)
    return began, time.monotonic()


def connections_exhausted(dep: Deployment) -> tuple[float, float]:
    """Another client takes every connection but FEW_LEFT and holds them EXHAUST_FOR s, then lets
    go. To leave the servers exactly FEW_LEFT, their role is refused new connections for the
    moment it takes: their backends are cut, the other client fills the freed slots, the role is
    let in again (it reconnects into what is left)."""
    cluster = dep.cluster
    hog_role = f"{dep.role}_hog"
    cluster.execute(f'CREATE ROLE "{hog_role}" LOGIN')
    dep.notes["connections_before"] = cluster.connections(dep.role)
    hog: list[psycopg.Connection] = []
    began = time.monotonic()
    try:
        cluster.execute(f'ALTER ROLE "{dep.role}" CONNECTION LIMIT 0')
        try:
            cluster.terminate(dep.role)
            time.sleep(0.05)  # the terminated backends leave their slots
            for _ in range(max(cluster.free_slots() - FEW_LEFT, 0)):
                try:
                    hog.append(psycopg.connect(cluster.url("postgres", hog_role), autocommit=True,
                                               connect_timeout=2))
                except psycopg.OperationalError:
                    break
        finally:
            cluster.execute(f'ALTER ROLE "{dep.role}" CONNECTION LIMIT -1')
        dep.notes["hogged"] = len(hog)
        time.sleep(EXHAUST_FOR)
        dep.notes["connections_during"] = cluster.connections(dep.role)
    finally:
        for conn in hog:
            conn.close()
    return began, time.monotonic()


def one_of_two_killed(dep: Deployment) -> tuple[float, float]:
    """`kill -9` of one of the two servers; it is started again on its port a second later."""
    victim = dep.servers[0]
    began = time.monotonic()
    victim.kill()
    time.sleep(1.0)
    victim.start().wait_healthy(timeout=30)
    dep.notes["restarts"] = [round(time.monotonic() - began, 2)]
    return began, time.monotonic()


def kill_cycles(dep: Deployment) -> tuple[float, float]:
    """KILL_CYCLES times in a row: `kill -9` of the server, started again at once, a second of load."""
    server = dep.servers[0]
    began = time.monotonic()
    dep.notes["restarts"] = []
    for _ in range(KILL_CYCLES):
        server.kill()
        killed = time.monotonic()
        server.start().wait_healthy(timeout=30)
        dep.notes["restarts"].append(round(time.monotonic() - killed, 2))
        time.sleep(1.0)
    return began, time.monotonic()


@dataclass(frozen=True)
class Scenario:
    fault: Callable[[Deployment], tuple[float, float]]
    servers: int = 1
    store_fault: bool = True  # the database misbehaves (servers live): answers are bounded, logs are quiet
    outages: int | None = 1  # how many times the store goes away and comes back (None: too many to count)
    server_env: dict[str, str] = field(default_factory=dict)


SCENARIOS = {
    "pg_restart": Scenario(pg_restart),
    "backends_killed": Scenario(backends_killed, outages=None),
    "connections_exhausted": Scenario(connections_exhausted, server_env={"SWITCHBOARD_PG_POOL_SIZE": "4"}),
    "one_of_two_killed": Scenario(one_of_two_killed, servers=2, store_fault=False),
    "kill_cycles": Scenario(kill_cycles, store_fault=False),
}


# -- what the log holds ------------------------------------------------------------------------


def _hex(public_id: str) -> str:
    return public_id[-32:]


@dataclass
class Ledger:
    """The event log read back, indexed by what the answers name."""

    deliveries: dict[str, list[str]]  # delivery id (X-GitHub-Delivery) -> todo ids it opened (hex)
    opened: set[str]
    claims: Counter
    completes: Counter

    @classmethod
    def read(cls, dep: Deployment) -> Ledger:
        container = build(Settings(database_url=dep.check_url, data_dir=str(dep.data_dir),
                                   secret_key=dep.secret_key))
        deliveries: dict[str, list[str]] = defaultdict(list)
        opened: set[str] = set()
        claims: Counter = Counter()
        completes: Counter = Counter()
        try:
            for record in container.app.audit():
                kind, aggregate = record["type"], _hex(record["aggregate"])
                if kind == "DeliveryAccepted":
                    delivery = record["data"]["delivery_key"].rsplit(":", 1)[-1]
                    deliveries[delivery].extend(_hex(t["id"]) for t in record["data"]["todos"] if t.get("id"))
                elif kind == "TodoOpened":
                    opened.add(aggregate)
                elif kind == "TodoClaimed":
                    claims[aggregate] += 1
                elif kind == "TodoCompleted":
                    completes[aggregate] += 1
        finally:
            container.close()
        return cls(dict(deliveries), opened, claims, completes)


# -- one scenario, start to end ----------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    scenario: Scenario
    answers: list[Answer]
    began: float
    ended: float
    load_ended: float
    ledger: Ledger
    verify: Result
    fault_stderr: dict[str, str]  # per server: what it wrote from the fault to the end of the load
    exit_codes: dict[str, int | None]
    notes: dict[str, object]

    @property
    def gone(self) -> float:
        """By when the store was surely gone: the end of the stop in `pg_restart` (a fast shutdown
        lets the sessions finish what they were doing), else the fault's start."""
        return self.began + float(self.notes.get("stopped_after", 0.0))

    def of(self, *kinds: str) -> list[Answer]:
        return [a for a in self.answers if a.kind in kinds]

    def during_fault(self, *kinds: str) -> list[Answer]:
        return [a for a in self.of(*kinds) if self.began <= a.started <= self.ended]

    def first_success_after(self, kind: str) -> float | None:
        """Seconds from the fault's end to the end of the first successful answer asked after it."""
        ends = [a.ended for a in self.of(kind) if a.outcome == "ok" and a.started >= self.ended]
        return min(ends) - self.ended if ends else None


def run(name: str, cluster: Cluster, root: Path, *, pre: float = 2.0, post: float = 4.0,
        ingest_threads: int = 3, agents: int = 2) -> Outcome:
    """One scenario, start to end; the servers are stopped whatever happens (the database is left
    to the cluster's drop)."""
    scenario = SCENARIOS[name]
    dep = Deployment(cluster, root, **scenario.server_env)
    try:
        for i in range(scenario.servers):
            dep.serve("ab"[i])
        dep.setup()
        load = dep.load(ingest_threads=ingest_threads, agents=agents).start()
        try:
            time.sleep(pre)
            marks = {s.out_path.stem: s.stderr_size() for s in dep.servers}
            began, ended = scenario.fault(dep)
            time.sleep(post)
        finally:
            load.stop()
        load_ended = time.monotonic()
        fault_stderr = {s.out_path.stem: s.stderr_since(marks[s.out_path.stem]) for s in dep.servers}
        dep.wait_serving()
        ledger = Ledger.read(dep)
        verify = dep.verify()
    finally:
        exit_codes = dep.stop()
    return Outcome(name, scenario, load.snapshot(), began, ended, load_ended, ledger, verify, fault_stderr,
                   exit_codes, dep.notes)


# -- what the answers and the log must agree on (each returns the problems found) --------------

ANSWER_BUDGET = 2.0  # seconds: the contract's 1 s, plus 1 s for a loaded 2-core machine
RECOVERY_BUDGET = 5.0  # seconds from the fault's end to a successful request of each kind
INGEST_OUTCOMES = {"ok", "unavailable", "refused", "lost", "timeout"}
TOOL_OUTCOMES = {"ok", "empty", "unavailable", "conflict", "refused", "lost", "timeout"}


def unstored_202s(o: Outcome) -> list[str]:
    """A 202 whose delivery or one of whose todos is not in the log."""
    problems = []
    for a in o.of("ingest"):
        if a.outcome != "ok":
            continue
        stored = o.ledger.deliveries.get(a.delivery)
        if stored is None:
            problems.append(f"202 for delivery {a.delivery} at +{a.started - o.began:.2f}s: no delivery in the log")
            continue
        missing = [t for t in a.todos if _hex(t) not in o.ledger.opened or _hex(t) not in stored]
        if missing:
            problems.append(f"202 for delivery {a.delivery}: todos {missing} not opened in the log")
    return problems


def stored_503s(o: Outcome) -> list[str]:
    """A 503 (or a refused connection) whose delivery is in the log anyway."""
    return [f"{a.status or a.outcome} for delivery {a.delivery} at +{a.started - o.began:.2f}s "
            f"(took {a.seconds:.3f}s), yet it is stored with todos {o.ledger.deliveries[a.delivery]}"
            for a in o.of("ingest") if a.outcome in ("unavailable", "refused") and a.delivery in o.ledger.deliveries]


def claimed_or_completed_twice(o: Outcome) -> list[str]:
    """No lease lapses in a scenario, so any todo claimed twice, completed twice, or handed to
    two claim_next answers is a double."""
    problems = [f"{t} claimed {n} times in the log" for t, n in o.ledger.claims.items() if n > 1]
    problems += [f"{t} completed {n} times in the log" for t, n in o.ledger.completes.items() if n > 1]
    handed = Counter(_hex(a.todos[0]) for a in o.of("claim_next") if a.outcome == "ok")
    problems += [f"{t} handed out by {n} claim_next answers" for t, n in handed.items() if n > 1]
    return problems


def completes_untrue(o: Outcome) -> list[str]:
    """`complete` answered ok must be in the log; answered `unavailable` must not be (a retry of
    it answering conflict because the todo is already done means the first answer lied)."""
    problems = []
    by_todo: dict[str, list[Answer]] = defaultdict(list)
    for a in o.of("complete"):
        by_todo[_hex(a.todos[0])].append(a)
    for todo, answers in by_todo.items():
        done = o.ledger.completes[todo] > 0
        outcomes = [a.outcome for a in answers]
        if "ok" in outcomes and not done:
            problems.append(f"td_{todo}: complete answered ok, no TodoCompleted in the log")
        if done and "ok" not in outcomes and "unavailable" in outcomes and not {"lost", "timeout"} & set(outcomes):
            detail = ", ".join(f"{a.outcome} ({a.detail[:60]})" for a in answers)
            problems.append(f"td_{todo}: completed in the log, but its completes answered only: {detail}")
    return problems


def orphan_claims(o: Outcome) -> list[str]:
    """A todo claimed in the log that no claim_next answer handed out: a claim answered with an
    error although it committed. Allowed only up to the number of claim_next answers that were
    lost with their connection (a killed server) or the agents' stop."""
    handed = {_hex(a.todos[0]) for a in o.of("claim_next") if a.outcome == "ok"}
    orphans = sorted(set(o.ledger.claims) - handed)
    ambiguous = sum(1 for a in o.of("claim_next") if a.outcome in ("lost", "timeout"))
    if len(orphans) > ambiguous:
        errors = [f"{a.outcome} ({a.detail[:80]})" for a in o.of("claim_next") if a.outcome not in ("ok", "empty")]
        return [f"{len(orphans)} todos claimed in the log but never handed out ({ambiguous} claim_next answers "
                f"were lost): {orphans[:5]}; the failed claim_next answers: {errors[:8]}"]
    return []


def unexpected_answers(o: Outcome) -> list[str]:
    """Ingest answers only 202 or 503 `store down` (or the connection fails: a killed server); MCP
    tools answer a result or `unavailable: store down` — never `internal`, never a JSON-RPC error."""
    bad = [a for a in o.of("ingest") if a.outcome not in INGEST_OUTCOMES]
    bad += [a for a in o.of("claim_next", "complete") if a.outcome not in TOOL_OUTCOMES]
    bad += [a for a in o.of("claim_next", "complete") if a.outcome == "unavailable"
            and a.detail != "unavailable: store down"]
    return [f"{a.kind} at +{a.started - o.began:.2f}s on {a.server}: {a.outcome} {a.status or ''} {a.detail[:120]}"
            for a in bad]


def resolved_late(o: Outcome, a: Answer) -> bool:
    """Asked before the store was surely gone (a commit may have been in flight when it went)
    and answered within ANSWER_BUDGET of its return: the contract has the server find out
    whether such a commit landed before it answers, which needs the store back (ADR 14)."""
    return a.started <= o.gone and a.ended <= o.ended + ANSWER_BUDGET


def slow_answers(o: Outcome, kinds: tuple[str, ...] = ("ingest", "claim_next", "complete")) -> list[str]:
    """Answers (of any kind) asked while the fault lasted that took longer than ANSWER_BUDGET,
    but for those `resolved_late`."""
    return [f"{a.kind} asked at +{a.started - o.began:.2f}s took {a.seconds:.2f}s -> {a.outcome} {a.detail[:80]}"
            for a in o.during_fault(*kinds) if a.seconds > ANSWER_BUDGET and not resolved_late(o, a)]


def not_back(o: Outcome) -> list[str]:
    """Each kind of request succeeds again within RECOVERY_BUDGET of the fault's end, and in the
    load's last second everything asked succeeds."""
    problems = []
    for kind in ("ingest", "claim_next", "complete"):
        back = o.first_success_after(kind)
        if back is None or back > RECOVERY_BUDGET:
            problems.append(f"{kind}: first success {back if back is None else round(back, 2)}s after the fault ended")
    tail = [a for a in o.answers if a.kind != "session" and a.started >= o.load_ended - 1.5 and a.ended <= o.load_ended - 0.5]
    failing = [a for a in tail if a.outcome not in ("ok", "empty")]
    if failing:
        problems.append(f"{len(failing)} of {len(tail)} requests failed at the load's end: "
                        + "; ".join(f"{a.kind} {a.outcome} {a.detail[:60]}" for a in failing[:5]))
    return problems


# A loop logs one line when the store goes and one when it is back (CONTRACT §12): two in one outage.
MAX_LINES_PER_LOOP = 2
_LOOP = re.compile(r"(switchboard[\w.]*)(?::| - [\w.]+ -) ([^:(]+):")


def loop_of(line: str) -> str:
    """Which loop a log line is from (`switchboard.background: scheduler: …` in either of the two
    log formats `serve` writes); any other line stands for itself (numbers aside), so a line
    repeated per retry or per request counts against its own allowance."""
    match = _LOOP.search(line)
    return f"{match.group(1)} {match.group(2)}" if match else re.sub(r"\d+", "N", line)


def noisy_stderr(o: Outcome) -> list[str]:
    """Over the fault, no server's stderr has a traceback, and in a scenario of one outage no loop
    (nor any other line) writes more than MAX_LINES_PER_LOOP lines: not a line per retry or per
    request. (`backends_killed` is a hundred short outages: only tracebacks are judged there.)"""
    problems = []
    for server, text in o.fault_stderr.items():
        lines = [line for line in text.splitlines() if line.strip()]
        if any("Traceback" in line for line in lines):
            problems.append(f"{server}: {sum('Traceback' in line for line in lines)} tracebacks")
        if o.scenario.outages != 1:
            continue
        per_loop = Counter(loop_of(line) for line in lines if not line[:1].isspace())
        noisy = {loop: n for loop, n in per_loop.items() if n > MAX_LINES_PER_LOOP}
        if noisy:
            shown = "\n    ".join(line[:200] for line in lines[:40])
            problems.append(f"{server}: more than {MAX_LINES_PER_LOOP} lines over one outage from "
                            + "; ".join(f"{loop[:120]} ({n})" for loop, n in noisy.items())
                            + f"; {len(lines)} lines in all:\n    {shown}")
    return problems


def summary(o: Outcome) -> str:
    """One line per kind of request: how its answers ended (shown with any failure)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for a in o.answers:
        counts[a.kind][a.outcome] += 1
    return (f"{o.name}: fault {o.ended - o.began:.2f}s; "
            + "; ".join(f"{k} {dict(v)}" for k, v in counts.items()) + (f"; {o.notes}" if o.notes else ""))
