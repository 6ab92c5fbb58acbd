"""A retention prune on SQLite, as `make run` keeps it under a data dir: what it reports is the
database's files on disk (the file and its `-wal`), and the space VACUUM frees leaves the disk."""

from __future__ import annotations

import re
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

from application.service import Caller
from tests.doubles import ManualClock
from tests.e2e._support import Cli
from tests.fixtures import fixture, sign

CLI = Caller.cli()
BODY = fixture("github_issues_opened.json")


def on_disk(database: Path) -> int:
    """What `ls -l` adds up for the database: its file and its write-ahead log."""
    return sum(path.stat().st_size for path in (database, Path(f"{database}-wal")) if path.exists())


def finished_deliveries(container, count: int) -> None:
    """`count` signed GitHub deliveries to one webhook, each opening a todo an agent completes."""
    container.app.ensure_admin()
    endpoint = container.app.vend("worker", queues=["work"], caller=CLI)
    hook = container.webhooks.create(caller=CLI, endpoint=endpoint["slug"], source_type="github",
                                     target_queue="work")
    agent = Caller("endpoint", endpoint["slug"])
    for n in range(count):
        body = BODY.replace(b'"number": 12', f'"number": {100 + n}'.encode())
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "issues",
                   "X-GitHub-Delivery": f"delivery-{n}", **sign("github", hook["signing_secret"], body)}
        todo = container.webhooks.ingest(hook["ingest_url"].rsplit("/", 1)[-1], headers, body,
                                         remote_addr="203.0.113.7")["id"]
        container.app.claim(todo, caller=agent)
        container.app.complete(todo, caller=agent, result={"n": n})


def test_a_prune_while_the_store_is_open_reports_the_files_and_leaves_no_vacuumed_copy_in_the_wal(
        sqlite_url, tmp_path, make_container):
    # the container stays open through the prune, as `serve` would: its connections keep the
    # -wal file, so what VACUUM writes there is not folded back when the CLI exits
    container = make_container(sqlite_url, clock=ManualClock(datetime.now(timezone.utc) - timedelta(days=3)))
    finished_deliveries(container, 3)
    database = tmp_path / "switchboard.db"
    wal = Path(f"{database}-wal")
    assert wal.stat().st_size > 0
    before = on_disk(database)

    done = Cli(sqlite_url, tmp_path).json("retention", "prune", "--older-than", "1d")

    after = on_disk(database)
    assert (done["deliveries"], done["todos"], done["payloads"]) == (3, 3, 6), done
    # the answer is the files on disk: not the page count of a WAL snapshot, which VACUUM shrinks
    # at once while it writes the whole database into the -wal file
    assert done["store_bytes_after"] == after, (done, after)
    assert done["store_bytes_after"] < done["store_bytes_before"], done
    # and the disk got the space back: the database file holds the VACUUMed copy, the log is empty
    assert after < before and wal.stat().st_size == 0, (before, after)
    assert (done["vacuumed"], done["checkpoint"]) == (["database"], "done"), done
    pages = sqlite3.connect(database).execute("PRAGMA page_count").fetchone()[0]
    assert database.stat().st_size == pages * 4096


def test_a_prune_that_frees_less_than_a_page_says_so_instead_of_looking_like_a_bug(
        sqlite_url, tmp_path, make_container):
    container = make_container(sqlite_url, clock=ManualClock(datetime.now(timezone.utc) - timedelta(days=3)))
    container.app.ensure_admin()
    endpoint = container.app.vend("worker", queues=["work"], caller=CLI)
    agent = Caller("endpoint", endpoint["slug"])
    todo = container.app.push(endpoint["slug"], "small", caller=CLI, payload={"n": 1})["todo"]["id"]
    container.app.claim(todo, caller=agent)
    container.app.complete(todo, caller=agent, result={"ok": 1})
    container.close()
    database = tmp_path / "switchboard.db"
    plain = sqlite3.connect(database)
    plain.execute("VACUUM")  # already as small as it gets
    plain.close()  # the last connection: the log is folded into the file and removed
    before = on_disk(database)
    assert before == database.stat().st_size

    text = Cli(sqlite_url, tmp_path).run("retention", "prune", "--older-than", "1d").ok().stdout

    # the prune's own event and its tombstones outweigh a few pruned bytes: the file
    # cannot shrink, and the answer says why rather than reporting a growth without a word
    assert text.startswith("removed 2 stored payloads"), text
    reported = re.search(r"payload store ([\d,]+) -> ([\d,]+) bytes on disk after VACUUM of database", text)
    assert reported, text
    first, last = (int(n.replace(",", "")) for n in reported.groups())
    assert last >= first >= before and last == on_disk(database), (before, text)
    assert "nothing on disk was given back" in text and "expected on a small store" in text, text
