"""End to end: the real `switchboard` CLI as a subprocess, on SQLite and on PostgreSQL (CONTRACT §2, §11)."""

from __future__ import annotations

import hashlib

import json
import re
import subprocess
import time
from datetime import datetime, timedelta, timezone

from tests.doubles import ManualClock
from application.service import Caller
from tests.e2e._support import CLI_MODULE, ISO, UNREACHABLE_PG, Cli, execute_sql, pairs

CLI = Caller.cli()

DEFAULT_VERBS = {
    "list_todos", "get_todo", "claim", "claim_next", "heartbeat", "complete", "fail", "release",
    "create_webhook", "list_webhooks", "rotate_webhook", "delete_webhook", "add_webhook_route",
    "remove_webhook_route", "list_webhook_routes", "list_webhook_rules", "set_webhook_rules",
    "test_webhook_rules", "list_webhook_events", "get_webhook_event", "get_default_lease",
    "set_default_lease",
}
ROW_KEYS = {
    "id", "queue", "source", "kind", "title", "state", "trust_mode", "owner", "attempt", "max_attempts",
    "lease_expires_at", "next_retry_at", "dead_letter", "created_at", "payload_size",
    "available_at",  # CONTRACT §13
}
TODO_ID = re.compile(r"^td_[0-9a-f]{32}$")


def _parse_time(text: str) -> datetime:
    assert ISO.match(text), text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seed(make_container, url: str, *, queues=("work", "other"), clock=None):
    """Operator `admin` and one endpoint, written in-process through the application layer."""
    container = make_container(url, clock=clock)
    container.app.ensure_admin()
    vended = container.app.vend("worker", queues=list(queues), caller=CLI)
    return container.app, vended


# -- operators -------------------------------------------------------------------------------


def test_operator_create_and_token(sqlite_url, tmp_path, make_container):
    cli = Cli(sqlite_url, tmp_path)

    created = cli.run("operator", "create", "admin").ok()
    shown = pairs(created.stdout)
    assert created.stdout.startswith("operator admin created\n")
    password = shown["password"]
    assert len(password) >= 16

    given = cli.run("operator", "create", "bob", "--password-stdin", "--json", stdin="correct horse battery\n").json()
    assert given == {"name": "bob", "password": None}

    duplicate = cli.run("--json", "operator", "create", "admin")
    assert "admin" in duplicate.refused("conflict", as_json=True)
    cli.run("operator", "create", "carol", "--password-stdin", stdin="short\n").refused("invalid_argument")
    cli.run("operator", "create", "Not A Name!").refused("invalid_argument")

    text = cli.run("operator", "token", "bob").ok()
    match = re.search(r"^token: (sbo_[A-Za-z0-9_-]{43})$", text.stdout, re.M)
    assert match, str(text)
    minted = cli.json("operator", "token", "bob")
    assert minted["name"] == "bob" and re.fullmatch(r"sbo_[A-Za-z0-9_-]{43}", minted["token"])
    assert minted["token"] != match.group(1)
    cli.run("operator", "token", "ghost", "--json").refused("not_found", as_json=True)

    # what the CLI wrote is what the application reads
    app = make_container(sqlite_url).app
    assert app.verify_password("admin", password)
    assert app.verify_password("bob", "correct horse battery")
    assert not app.verify_password("bob", password)
    assert not app.verify_password("carol", "short")


# -- endpoints -------------------------------------------------------------------------------


def test_endpoint_vend_list_revoke(sqlite_url, tmp_path, make_container):
    cli = Cli(sqlite_url, tmp_path)
    make_container(sqlite_url).app.ensure_admin()

    before = datetime.now(timezone.utc)
    first = cli.json("endpoint", "vend", "Build Bot", "--queue", "alpha", "--queue", "beta", "--ttl", "7d",
                     env={"SWITCHBOARD_BASE_URL": "https://sb.example"})
    assert set(first) == {"endpoint_id", "slug", "mcp_url", "credential", "queues", "verbs", "expires_at", "mcp_json"}
    assert re.fullmatch(r"ep_[0-9a-f]{32}", first["endpoint_id"])
    slug = first["slug"]
    assert re.fullmatch(r"build-bot-[a-z0-9]{4}", slug)
    assert first["mcp_url"] == f"https://sb.example/mcp/{slug}"
    assert re.fullmatch(r"sbk_[A-Za-z0-9_-]{43}", first["credential"])
    assert first["queues"] == ["alpha", "beta"]
    assert set(first["verbs"]) == DEFAULT_VERBS
    expires = _parse_time(first["expires_at"])
    week = timedelta(days=7)
    assert before + week - timedelta(seconds=5) <= expires <= datetime.now(timezone.utc) + week
    assert first["mcp_json"] == {"mcpServers": {"switchboard": {
        "type": "http", "url": first["mcp_url"], "headers": {"Authorization": f"Bearer {first['credential']}"},
    }}}

    # plain text output carries the same fields; --verbs is a comma list; --ttl never → no expiry
    second_run = cli.run(
        "endpoint", "vend", "second", "--queue", "alpha", "--verbs", "claim, complete", "--ttl", "never",
    ).ok()
    second = pairs(second_run.stdout)
    assert set(second) == set(first), str(second_run)
    assert json.loads(second["verbs"]) == ["claim", "complete"]
    assert second["expires_at"] == ""

    bogus, zero, nobody = cli.run_all(
        ("endpoint", "vend", "third", "--queue", "alpha", "--ttl", "bogus"),
        ("endpoint", "vend", "third", "--queue", "alpha", "--ttl", "0d"),
        ("endpoint", "vend", "third", "--queue", "alpha", "--owner", "nobody"),
    )
    bogus.usage()
    zero.usage()
    nobody.refused("not_found")

    listed = cli.json("endpoint", "list")
    assert set(listed) == {"endpoints"}
    rows = {row["slug"]: row for row in listed["endpoints"]}
    assert set(rows) == {slug, second["slug"]}  # nothing from the refused vends
    assert rows[slug]["endpoint_id"] == first["endpoint_id"]
    assert rows[slug]["owner"] == "admin" and rows[slug]["revoked"] is False
    assert "credential" not in rows[slug] and first["credential"] not in json.dumps(listed)

    revoked = cli.json("endpoint", "revoke", slug)  # by slug
    assert revoked["slug"] == slug and revoked["revoked"] is True and revoked["released_leases"] == 0
    by_id = cli.run("endpoint", "revoke", second["endpoint_id"]).ok()  # by id
    assert by_id.stdout.strip() == f"endpoint {second['slug']} revoked; 0 lease(s) released"

    twice, unknown, too_late = cli.run_all(
        ("endpoint", "revoke", first["endpoint_id"], "--json"),
        ("endpoint", "revoke", "no-such-slug"),
        ("todo", "push", slug, "too late"),
    )
    twice.refused("conflict", as_json=True)
    unknown.refused("not_found")
    too_late.refused("conflict")
    assert all(row["revoked"] for row in cli.json("endpoint", "list")["endpoints"])


# -- todos -----------------------------------------------------------------------------------


def test_todo_push_list_show_history(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    _, endpoint = _seed(make_container, store_url)
    slug = endpoint["slug"]

    pushed = cli.json("todo", "push", slug, "first", "--payload", '{"n": 1, "s": "é"}', "--key", "k-1")
    assert pushed["created"] is True
    todo = pushed["todo"]
    assert set(todo) == ROW_KEYS
    assert TODO_ID.match(todo["id"])
    assert todo["queue"] == "work" and todo["state"] == "pending" and todo["attempt"] == 0
    assert todo["source"] == "operator" and todo["trust_mode"] == "operator" and todo["max_attempts"] == 5
    assert todo["payload_size"] == len(json.dumps({"n": 1, "s": "é"}, separators=(",", ":")).encode())

    again = cli.json("todo", "push", slug, "first again", "--payload", "{}", "--key", "k-1")
    assert again["created"] is False and again["todo"]["id"] == todo["id"] and again["todo"]["title"] == "first"

    payload_file = tmp_path / "payload.json"
    payload_file.write_text(json.dumps({"from": "file", "list": [1, 2, 3]}))
    # the endpoint named by its id, the payload from @file, another queue; plain output
    second = cli.run(
        "todo", "push", endpoint["endpoint_id"], "second", "--payload", f"@{payload_file}", "--queue", "other",
    ).ok()
    match = re.fullmatch(r"(td_[0-9a-f]{32}) created on other\n", second.stdout)
    assert match, str(second)
    second_id = match.group(1)

    listed = cli.json("todo", "list")
    assert set(listed) == {"todos"}
    assert [row["id"] for row in listed["todos"]] == [second_id, todo["id"]]  # newest first
    assert all(set(row) == ROW_KEYS for row in listed["todos"])
    filtered = cli.json("todo", "list", "--endpoint", slug, "--state", "pending", "--queue", "other")
    assert [row["id"] for row in filtered["todos"]] == [second_id]
    assert [row["id"] for row in cli.json("todo", "list", "--limit", "1")["todos"]] == [second_id]
    table = cli.run("todo", "list").ok().stdout.splitlines()  # without --json: a table, newest first
    assert table[0].split() == ["ID", "QUEUE", "STATE", "ATTEMPT", "OWNER", "CREATED_AT", "AVAILABLE_AT", "TITLE"]
    assert [line.split()[0] for line in table[1:]] == [second_id, todo["id"]]
    later = cli.json("todo", "push", slug, "later", "--not-before", "2030-01-01T09:00:00Z")["todo"]["id"]
    row = next(line for line in cli.run("todo", "list").ok().stdout.splitlines() if line.startswith(later))
    assert "2030-01-01T09:00:00" in row  # a delayed todo says when it becomes claimable

    shown = cli.json("todo", "show", second_id)
    assert shown["id"] == second_id and shown["payload"] == {"from": "file", "list": [1, 2, 3]}
    assert shown["prior_attempts"] == [] and shown["result"] is None

    history = cli.json("todo", "history", todo["id"])
    assert set(history) == {"events"}
    (opened,) = history["events"]
    assert {"position", "version", "time", "type", "actor", "data"} <= set(opened)
    assert opened["version"] == 1 and opened["type"] == "TodoOpened" and opened["actor"] == "operator:cli"
    assert opened["data"]["payload"] == {"n": 1, "s": "é"} and opened["data"]["idempotency_key"] == "k-1"
    _parse_time(opened["time"])


def test_todo_refusals(sqlite_url, tmp_path, make_container):
    cli = Cli(sqlite_url, tmp_path)
    app, endpoint = _seed(make_container, sqlite_url)
    slug = endpoint["slug"]
    pending = app.push(slug, "pending", caller=CLI)["todo"]["id"]
    missing = "td_" + "0" * 32
    results = cli.run_all(
        ("todo", "push", slug, "bad", "--payload", "{nope"),
        ("todo", "push", slug, "bad", "--payload", f"@{tmp_path}/missing.json"),
        ("todo", "push", slug, "bad", "--queue", "elsewhere"),
        ("todo", "push", "no-such-endpoint", "bad"),
        ("todo", "list", "--limit", "0", "--json"),
        ("todo", "list", "--limit", "1001"),
        ("todo", "list", "--state", "bogus"),
        ("todo", "retry", pending, "--json"),
        ("todo", "show", missing, "--json"),
        ("todo", "history", missing),
        ("todo", "retry", "not-an-id"),
        ("todo", "explain", missing, "--json"),
    )
    expected = [
        ("invalid_argument", False), ("invalid_argument", False), ("forbidden", False), ("not_found", False),
        ("invalid_argument", True), ("invalid_argument", False), ("invalid_argument", False),
        ("conflict", True), ("not_found", True), ("not_found", False), ("not_found", False),
        ("not_found", True),
    ]
    for result, (code, as_json) in zip(results, expected):
        result.refused(code, as_json=as_json)
    assert "1..1000" in results[4].stderr
    # the boundaries themselves are accepted; nothing above changed the store
    assert [row["id"] for row in cli.json("todo", "list", "--limit", "1000")["todos"]] == [pending]


def test_retry_dead_letter_and_failed(store_url, tmp_path, make_container):
    """Drives two todos to `failed` in-process (one dead-lettered), then revives both with the CLI."""
    cli = Cli(store_url, tmp_path)
    clock = ManualClock(datetime.now(timezone.utc) - timedelta(days=1))
    app, endpoint = _seed(make_container, store_url, clock=clock)
    agent = Caller("endpoint", endpoint["slug"])
    dead = app.push(endpoint["slug"], "doomed", caller=CLI)["todo"]["id"]
    waiting = app.push(endpoint["slug"], "flaky", caller=CLI)["todo"]["id"]
    for _ in range(5):
        app.claim(dead, caller=agent, claimant="e2e")
        app.fail(dead, caller=agent, summary="boom")
        clock.advance(minutes=20)
    app.claim(waiting, caller=agent)
    app.fail(waiting, caller=agent, summary="try later")

    failed = {row["id"]: row for row in cli.json("todo", "list", "--state", "failed")["todos"]}
    assert set(failed) == {dead, waiting}
    assert failed[dead]["dead_letter"] is True and failed[dead]["next_retry_at"] is None
    assert failed[dead]["attempt"] == 5
    assert failed[waiting]["dead_letter"] is False and failed[waiting]["next_retry_at"] is not None

    explained = cli.json("todo", "explain", dead)
    assert set(explained) == {"state", "because", "story", "attempts"} and explained["state"] == "failed"
    assert explained["because"].startswith("dead letter: the 5th attempt failed at ")
    assert explained["because"].endswith(": “boom”; only an operator's retry revives it")
    lines = cli.run("todo", "explain", waiting).ok().stdout.splitlines()
    # the because first (the CLI runs on the wall clock, a day after this retry fell due), then the story
    assert lines[0].startswith("failed, retry due since ") and lines[0].endswith(": “try later”")
    assert lines[1] == "" and len(lines) == 2 + 3 + 3  # pushed, claimed, failed: one sentence a line, with its time
    assert lines[2].endswith(f"  Pushed by the CLI to endpoint {endpoint['slug']}, queue work (source operator).")
    assert lines[5:7] == ["", "attempts:"]  # then each attempt: n, outcome, times, traceparent, claimant
    assert re.fullmatch(r"\s+1  failed\s+\S+Z \.\. \S+Z\s+00-[0-9a-f]{32}-[0-9a-f]{16}-01  \S+", lines[7]), lines[7]

    revived = cli.json("todo", "retry", dead)
    assert revived["id"] == dead and revived["state"] == "pending" and revived["attempt"] == 0
    assert revived["dead_letter"] is False and revived["next_retry_at"] is None
    text = cli.run("todo", "retry", waiting).ok()
    assert text.stdout.strip() == f"{waiting} pending (attempt 0/5)"

    shown = cli.json("todo", "show", dead)
    assert shown["state"] == "pending" and shown["attempt"] == 0 and shown["attempt_seq"] == 5
    assert [a["outcome"] for a in shown["prior_attempts"]] == ["failed"] * 5

    events = cli.json("todo", "history", dead)["events"]
    assert [e["version"] for e in events] == list(range(1, len(events) + 1))
    positions = [e["position"] for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    types = [e["type"] for e in events]
    assert types[0] == "TodoOpened" and types[-1] == "TodoRequeued"
    assert types.count("TodoClaimed") == 5 and types.count("TodoFailed") == 5
    agent_events = [e for e in events if e["type"] in ("TodoClaimed", "TodoFailed")]
    assert {e["actor"] for e in agent_events} == {f"endpoint:{endpoint['slug']}"}
    assert events[-1]["actor"] == "operator:cli"
    times = [_parse_time(e["time"]) for e in events]
    assert times == sorted(times)
    assert events[-2]["data"]["dead_letter"] is True
    assert cli.json("todo", "explain", dead)["story"][-1]["text"] == (
        "Retried by the CLI with a fresh budget of 5 attempts: pending again.")

    verified = cli.json("projections", "rebuild", "--verify")
    assert verified == {"verified": True, "differences": []}


# -- projections and audit -------------------------------------------------------------------


def test_projections_rebuild_and_verify(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    app, endpoint = _seed(make_container, store_url)
    todo_id = app.push(endpoint["slug"], "to be tampered with", caller=CLI)["todo"]["id"]
    app.views.catch_up()

    verified = cli.run("projections", "rebuild", "--verify").ok()
    assert "read models match" in verified.stdout

    # a read model that disagrees with the log: --verify reports it and exits 1, rebuild repairs it
    assert execute_sql(store_url, f"UPDATE sb_todo_rows SET title = 'tampered' WHERE todo_id = '{todo_id}'") == 1
    broken = cli.run("projections", "rebuild", "--verify")
    assert broken.code == 1 and "Traceback" not in broken.stderr, str(broken)
    assert "sb_todo_rows" in broken.stdout
    report = cli.run("--json", "projections", "rebuild", "--verify")
    assert report.code == 1, str(report)
    document = json.loads(report.stdout)
    assert document["verified"] is False
    assert [d["table"] for d in document["differences"]] == ["sb_todo_rows"]
    assert cli.json("todo", "list")["todos"][0]["title"] == "tampered"  # verify changed nothing

    rebuilt = cli.run("projections", "rebuild").ok()
    assert "events replayed" in rebuilt.stdout
    assert cli.json("projections", "rebuild", "--verify") == {"verified": True, "differences": []}
    assert cli.json("todo", "list")["todos"][0]["title"] == "to be tampered with"


def test_audit_export(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    app, endpoint = _seed(make_container, store_url)
    todo_id = app.push(endpoint["slug"], "audited", caller=CLI, payload={"x": 1})["todo"]["id"]

    lines = cli.run("audit", "export").ok().stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) >= 3  # operator, endpoint, todo
    for record in records:
        assert {"position", "time", "aggregate", "type", "data"} <= set(record)
        _parse_time(record["time"])
    positions = [r["position"] for r in records]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    types = [r["type"] for r in records]
    assert types[:2] == ["OperatorCreated", "EndpointVended"] and "TodoOpened" in types
    opened = next(r for r in records if r["type"] == "TodoOpened")
    # the payload by reference to the payload store (docs/adr/0027), as the audit chain seals it
    assert opened["aggregate"] == todo_id and "payload" not in opened["data"] and opened["digests"]["payload"] == {
        "sha256": hashlib.sha256(b'{"x":1}').hexdigest(), "size": 7}
    # every aggregate is named by its public id, as everywhere else (`audit export | grep td_…` works)
    assert (opened["aggregate_type"], records[1]["aggregate_type"]) == ("todo", "endpoint")
    assert records[1]["aggregate"] == endpoint["endpoint_id"]
    assert records[0]["aggregate_type"] == "operator" and records[0]["aggregate"].startswith("op_")
    prefixes = {"todo": "td_", "endpoint": "ep_", "operator": "op_", "webhook": "wh_", "delivery": "ev_",
                "idempotency_key": "ik_"}
    for record in records:
        assert re.fullmatch(prefixes[record["aggregate_type"]] + "[0-9a-f]{32}", record["aggregate"]), record
    assert any(todo_id in line for line in lines)

    after = positions[0]
    tail = cli.run("audit", "export", "--after", str(after)).ok().stdout.splitlines()
    assert [json.loads(line) for line in tail] == records[1:]
    assert cli.run("audit", "export", "--after", str(positions[-1])).ok().stdout == ""

    # --json does not turn the export into one document: still JSON lines
    assert cli.run("--json", "audit", "export", "--after", str(after)).ok().stdout.splitlines() == tail


def test_audit_export_into_a_closed_pipe(sqlite_url, tmp_path, make_container):
    """`switchboard audit export | head -1`: the reader goes away; no traceback."""
    cli = Cli(sqlite_url, tmp_path)
    app, endpoint = _seed(make_container, sqlite_url)
    for i in range(4):  # well over a pipe buffer of output
        app.push(endpoint["slug"], f"big {i}", caller=CLI, payload={"blob": "x" * 100_000})
    proc = subprocess.Popen([*CLI_MODULE, "audit", "export"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=cli.env(), cwd=tmp_path)
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=30)
    assert json.loads(first)["position"] == 1
    assert "Traceback" not in stderr, stderr
    assert proc.returncode == 0, (proc.returncode, stderr)


def test_a_reader_that_closes_the_pipe_early_is_not_an_error(store_url, tmp_path, make_container):
    """`set -o pipefail; switchboard audit export | head -1` exits 0; so does any command whose
    reader is gone before it writes (its output still in the buffer when it exits)."""
    cli = Cli(store_url, tmp_path)
    app, endpoint = _seed(make_container, store_url)
    for i in range(3):
        app.push(endpoint["slug"], f"small {i}", caller=CLI)
    command = " ".join([*CLI_MODULE, "audit", "export"])
    piped = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | head -1"], capture_output=True, text=True,
                           env=cli.env(), cwd=tmp_path, timeout=60)
    assert piped.returncode == 0, piped
    assert len(piped.stdout.splitlines()) == 1 and piped.stderr == "", piped
    for args in (("audit", "export"), ("todo", "list"), ("events", "list"), ("todo", "list", "--json")):
        proc = subprocess.Popen([*CLI_MODULE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=cli.env(), cwd=tmp_path)
        proc.stdout.close()  # gone before the command writes a byte
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0, (args, stderr)
        assert stderr == "", (args, stderr)


# -- the command line itself ------------------------------------------------------------------


def test_json_anywhere_and_usage_errors(sqlite_url, tmp_path, make_container):
    cli = Cli(sqlite_url, tmp_path)
    _, endpoint = _seed(make_container, sqlite_url)
    slug = endpoint["slug"]

    at_front, at_end, in_middle = (r.json() for r in cli.run_all(
        ("--json", "endpoint", "list"), ("endpoint", "list", "--json"), ("endpoint", "--json", "list"),
    ))
    assert at_front == at_end == in_middle and [e["slug"] for e in at_front["endpoints"]] == [slug]
    # --database-url before the group or after the command (here against an empty store)
    other = f"sqlite:///{tmp_path}/other.db"
    assert cli.run("--database-url", other, "--json", "todo", "list").json() == {"todos": []}
    assert cli.run("todo", "list", "--database-url", other, "--json").json() == {"todos": []}

    for result in cli.run_all(
        ("frobnicate",),
        ("todo", "show"),  # missing argument
        ("todo", "frobnicate", "x"),
        ("todo",),  # missing action
        (),
        ("--json", "todo", "list", "--limit", "many"),
        ("endpoint", "vend", "agent"),  # --queue is required
        ("todo", "list", "--bogus-flag"),
    ):
        result.usage()
        assert result.stdout == "", str(result)


def test_bad_or_unreachable_store(tmp_path):
    bad = Cli("mysql://x", tmp_path)
    plain, as_json, ttl = bad.run_all(
        ("endpoint", "list"),
        ("todo", "list", "--json"),
        ("endpoint", "vend", "agent", "--queue", "q", "--ttl", "bogus"),
    )
    assert "mysql://x" in plain.refused("invalid_configuration")
    as_json.refused("invalid_configuration", as_json=True)
    ttl.usage()  # a usage error is reported as one before the store is touched

    unreachable = Cli(UNREACHABLE_PG, tmp_path)
    started = time.monotonic()
    result = unreachable.run("todo", "list", timeout=20)
    assert time.monotonic() - started < 10
    assert "127.0.0.1:1" in result.refused("unavailable")

    # the flag overrides the environment
    flag = Cli(UNREACHABLE_PG, tmp_path).run("--database-url", "mysql://y", "endpoint", "list")
    assert "mysql://y" in flag.refused("invalid_configuration")


def test_retention_prune_counts_removes_and_todo_show_says_so(store_url, tmp_path, make_container):
    clock = ManualClock(datetime.now(timezone.utc) - timedelta(days=3))
    app, endpoint = _seed(make_container, store_url, clock=clock)
    agent = Caller("endpoint", endpoint["slug"])
    done = app.push(endpoint["slug"], "old and done", caller=CLI, payload={"big": "x" * 500})["todo"]["id"]
    live = app.push(endpoint["slug"], "old but live", caller=CLI, payload={"keep": True})["todo"]["id"]
    app.claim(done, caller=agent)
    app.complete(done, caller=agent, result={"ok": 1})
    cli = Cli(store_url, tmp_path)

    assert cli.run("retention", "prune", "--older-than", "1w").code == 2  # a usage error, named
    dry = cli.json("retention", "prune", "--older-than", "1d", "--dry-run")
    assert (dry["todos"], dry["payloads"], dry["dry_run"]) == (1, 2, True)
    assert cli.run("retention", "prune", "--older-than", "1d", "--dry-run", "--reclaim").code == 2
    text = cli.run("retention", "prune", "--older-than", "1d").ok().stdout
    assert text.startswith("removed 2 stored payloads") and "payload store" in text
    if store_url.startswith("sqlite"):
        assert "after VACUUM of database" in text and "--reclaim" not in text, text
    else:  # the operator is told the files keep their size, and how to give the space back
        assert "after VACUUM of sb_blobs\nthe freed space is reused by new payloads" in text and "--reclaim" in text, text

    shown = pairs(cli.run("todo", "show", done).ok().stdout)
    assert re.fullmatch(r"payload pruned at \S+Z \(sha256 [0-9a-f]{64}, \d+ bytes\)", shown["payload"]), shown
    assert shown["result"].startswith("result pruned at ")
    assert cli.json("todo", "show", live)["payload"] == {"keep": True}
    assert cli.json("projections", "rebuild", "--verify")["verified"] is True
    assert cli.json("retention", "prune", "--older-than", "1d")["payloads"] == 0
    reclaimed = cli.json("retention", "prune", "--older-than", "1d", "--reclaim")
    assert (reclaimed["payloads"], reclaimed["space"]) == (0, "system") and reclaimed["vacuumed"][-1] in (
        "database", "sb_blobs (FULL)")
