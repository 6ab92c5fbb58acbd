"""Bytes per delivery in the store: events + read models + payloads, on SQLite and PostgreSQL.

Run:  .venv/bin/python bench/store_size.py [--deliveries 400] [--targets 1,3] [--pg-url URL] [--no-pg]

For each store and each fan-out (1 target: the webhook's owner; 3: the owner plus two routed
endpoints), a fresh store (SQLite file in a temporary dir; PostgreSQL database created on the
admin URL and dropped at the end) gets an admin, the endpoints and one GitHub webhook through
`interfaces.bootstrap.build`, then N signed deliveries of tests/fixtures/github_issues_opened.json
(10,734 bytes, each with its own X-GitHub-Delivery so each opens a todo per target) through the
application layer (`Webhooks.ingest`, as the HTTP route calls it), and the projections are
caught up. Size is measured before and after the N deliveries:

- SQLite: per table and index from the `dbstat` virtual table (pages in use), after `VACUUM`;
- PostgreSQL: `pg_total_relation_size` per table (heap + TOAST + indexes) after `VACUUM`, and the
  WAL written by the N deliveries and their catch-up (`pg_current_wal_lsn`).

Printed per delivery: events (`stored_events`), payloads (the content-addressed blobs, when the
store has them), read models (every other table), total, and total ÷ body size (the goal of
issue 14: ≤ 1.2 for one target).
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from application.service import Caller  # noqa: E402
from bench.claim_complete import Databases, log  # noqa: E402
from interfaces.bootstrap import build  # noqa: E402
from interfaces.settings import Settings  # noqa: E402
from tests.fixtures import fixture, sign  # noqa: E402

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
FIXTURE = "github_issues_opened.json"
SECRET_KEY = "be" * 32
QUEUE = "inbox"
EVENTS_TABLES = ("stored_events",)
PAYLOAD_TABLES = ("sb_blobs",)


def sqlite_sizes(path: str) -> dict[str, int]:
    """Bytes in use per table, its indexes counted with it (after VACUUM, so free pages do not count)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("VACUUM")
        tables = dict(conn.execute("SELECT name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')"))
        sizes: dict[str, int] = {}
        for name, used in conn.execute("SELECT name, SUM(pgsize - unused) FROM dbstat GROUP BY name"):
            table = tables.get(name, name)
            sizes[table] = sizes.get(table, 0) + int(used)
        return sizes
    finally:
        conn.close()


def pg_sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'r' AND n.nspname = 'public'"
        ).fetchall()
    return {name: int(size) for name, size in rows}


def pg_wal(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])


def setup(container, targets: int) -> tuple[str, str]:
    """Admin, `targets` endpoints and one GitHub webhook routed to all of them: (token, secret)."""
    cli = Caller.cli()
    container.app.ensure_admin()
    slugs = [container.app.vend(f"size-bench-{n}", queues=[QUEUE], caller=cli)["slug"] for n in range(targets)]
    hook = container.webhooks.create(caller=cli, endpoint=slugs[0], source_type="github", target_queue=QUEUE)
    for slug in slugs[1:]:
        endpoint_id = container.app.endpoint(slug, caller=cli).endpoint_id
        container.webhooks.add_route(hook["webhook_id"], endpoint_id, caller=cli)
    return hook["ingest_url"].rsplit("/", 1)[1], hook["signing_secret"]


def varied(body: bytes, n: int) -> bytes:
    """The fixture with its issue number made unique (same length): every real delivery differs."""
    return re.sub(rb'"number": \d+,', b'"number": ' + str(100_000 + n % 900_000).encode() + b",", body, count=1)


SEQUENCE = iter(range(10**9))


def deliver(container, token: str, secret: str, template: bytes, n: int) -> None:
    for _ in range(n):
        body = varied(template, next(SEQUENCE))
        headers = {
            "Content-Type": "application/json", "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": str(uuid.uuid4()), "User-Agent": "GitHub-Hookshot/bench",
            **sign("github", secret, body),
        }
        container.webhooks.ingest(token, headers, body, remote_addr="127.0.0.1")
    container.projector.catch_up()


def measure(label: str, database_url: str, data_dir: str, targets: int, n: int, body: bytes,
            sizes, wal=None) -> dict[str, float]:
    container = build(Settings(database_url=database_url, data_dir=data_dir, secret_key=SECRET_KEY))
    try:
        token, secret = setup(container, targets)
        deliver(container, token, secret, body, 5)  # the first rows of each table and index
        before = sizes()
        wal_before = wal() if wal else 0
        deliver(container, token, secret, body, n)
        wal_after = wal() if wal else 0
        after = sizes()
    finally:
        container.close()
    grown = {name: (after.get(name, 0) - before.get(name, 0)) / n for name in after}
    events = sum(v for k, v in grown.items() if k in EVENTS_TABLES)
    payloads = sum(v for k, v in grown.items() if k in PAYLOAD_TABLES)
    models = sum(v for k, v in grown.items() if k not in EVENTS_TABLES + PAYLOAD_TABLES)
    total = events + payloads + models
    result = {"events": events, "payloads": payloads, "read_models": models, "total": total,
              "ratio": total / len(body), "wal": (wal_after - wal_before) / n if wal else 0.0}
    top = sorted(((v, k) for k, v in grown.items() if v > 0), reverse=True)
    log(f"  {label:<22} {targets} target(s): events {events:8.0f}  payloads {payloads:8.0f}  "
        f"read models {models:8.0f}  total {total:8.0f} B  = {result['ratio']:.2f}x the body"
        + (f"  WAL {result['wal']:8.0f} B" if wal else ""))
    log("      by table: " + ", ".join(f"{k} {v:.0f}" for v, k in top))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=400)
    parser.add_argument("--targets", default="1,3")
    parser.add_argument("--pg-url", default=ADMIN_URL)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    body = varied(fixture(FIXTURE), 0)
    assert json.loads(body)["issue"]["number"] == 100_000  # still JSON
    fanouts = [int(t) for t in args.targets.split(",")]
    log(f"bytes per delivery: {FIXTURE} ({len(body):,} bytes), {args.deliveries} deliveries per store")
    results: dict[tuple[str, int], dict[str, float]] = {}
    for targets in fanouts:
        with tempfile.TemporaryDirectory(prefix="sb-size-") as tmp:
            path = f"{tmp}/switchboard.db"
            results[("sqlite", targets)] = measure(
                "SQLite", f"sqlite:///{path}", tmp, targets, args.deliveries, body, lambda: sqlite_sizes(path))
    if not args.no_pg:
        dbs = Databases(args.pg_url)
        try:
            for targets in fanouts:
                url = dbs.create(f"size{targets}")
                with tempfile.TemporaryDirectory(prefix="sb-size-") as tmp:
                    results[("postgres", targets)] = measure(
                        "PostgreSQL (lz4 TOAST)", url, tmp, targets, args.deliveries, body,
                        lambda: pg_sizes(url), lambda: pg_wal(url))
                dbs.drop(url)
        finally:
            dbs.drop_all()
    for (store, targets), r in results.items():
        log(f"store_size {store} targets={targets} bytes_per_delivery={r['total']:.0f} ratio_to_body={r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
