"""The audit hash chain end to end (CONTRACT §14): real stores, the real CLI, the stdlib script.

Tampering is done as an intruder would: SQL on the store's own tables, or an editor on an export.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from application.service import Caller
from tests.e2e._support import Cli, execute_sql
from tests.e2e._ingest import query

CLI = Caller.cli()
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "audit_verify.py"


def _workload(make_container, url: str):
    """Every kind of digested content: payloads, results, bodies (UTF-8 and not), a password hash."""
    container = make_container(url)
    app = container.app
    app.ensure_admin()
    vended = app.vend("worker", queues=["work"], caller=CLI)
    agent = Caller("endpoint", vended["slug"])
    first = app.push(vended["slug"], "audited one", caller=CLI, payload={"n": 1, "text": "ünïcode", "f": 1.5e16})
    second = app.push(vended["slug"], "audited two", caller=CLI, payload=[1, 2, {"b": None, "a": True}])
    app.claim(first["todo"]["id"], caller=agent)
    app.complete(first["todo"]["id"], caller=agent, result={"ok": 1}, summary="done")
    app.claim(second["todo"]["id"], caller=agent)
    app.fail(second["todo"]["id"], caller=agent, result="broke", summary="no")
    hook = container.webhooks.create(caller=CLI, endpoint=vended["slug"], source_type="generic", target_queue="work")
    token = hook["ingest_url"].rsplit("/", 1)[1]
    container.webhooks.ingest(token, {"Content-Type": "application/json"}, b'{"hello": "world",  "x": [1]}')
    container.webhooks.ingest(token, {"Content-Type": "application/octet-stream"}, b"\xff\xfe\x00 not utf-8")
    return container


def _positions(url: str) -> list[tuple[int, str]]:
    column = "rowid" if url.startswith("sqlite") else "notification_id"
    return [(int(p), t) for p, t in query(url, f"SELECT {column}, topic FROM stored_events ORDER BY {column}")]


def _script(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60)


# -- an export file ---------------------------------------------------------------------------


def _edit_byte(lines: list[str]) -> tuple[list[str], int, str]:
    i = next(i for i, line in enumerate(lines) if "audited two" in line)
    return lines[:i] + [lines[i].replace("audited two", "audited twO")] + lines[i + 1:], json.loads(lines[i])["position"], "altered"


def _edit_payload(lines: list[str]) -> tuple[list[str], int, str]:
    # a body is stored once and named by reference (docs/adr/0027): its export line carries its
    # digest and size, which the chain seals; a changed reference is an altered event
    i = next(i for i, line in enumerate(lines) if '"DeliveryAccepted"' in line)
    record = json.loads(lines[i])
    record["digests"]["body"]["size"] += 1
    return lines[:i] + [json.dumps(record)] + lines[i + 1:], record["position"], "altered"


def _delete(lines: list[str]) -> tuple[list[str], int, str]:
    return lines[:3] + lines[4:], json.loads(lines[3])["position"], "missing"


def _duplicate(lines: list[str]) -> tuple[list[str], int, str]:
    return lines[:5] + [lines[3]] + lines[5:], json.loads(lines[3])["position"], "duplicated"


def _swap(lines: list[str]) -> tuple[list[str], int, str]:
    return lines[:3] + [lines[4], lines[3]] + lines[5:], json.loads(lines[3])["position"], "out of order"


def test_an_export_verifies_with_the_cli_and_the_stdlib_script(store_url, tmp_path, make_container):
    container = _workload(make_container, store_url)
    cli = Cli(store_url, tmp_path)
    exported = cli.run("audit", "export").ok().stdout
    path = tmp_path / "export.jsonl"
    path.write_text(exported)
    records = [json.loads(line) for line in exported.splitlines()]
    assert len(records) == len(_positions(store_url))
    assert records[0]["prev_hash"] == "0" * 64
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(records, records[1:]))
    kinds = {r["type"]: set(r.get("digests", {})) for r in records}
    assert kinds["TodoOpened"] == {"payload"} and kinds["DeliveryAccepted"] == {"body"}
    assert kinds["TodoCompleted"] == kinds["TodoFailed"] == {"result"} and kinds["OperatorCreated"] == {"password_hash"}
    head = container.audit.head()
    expected = f"chain intact: {len(records)} events, head {records[-1]['hash']}"
    assert head["hash"] == records[-1]["hash"] and head["position"] == records[-1]["position"]

    assert cli.run("audit", "verify", "--file", str(path)).ok().stdout.strip() == expected
    assert cli.run("audit", "verify").ok().stdout.strip() == expected
    script = _script(path)
    assert (script.returncode, script.stdout.strip()) == (0, expected), script.stderr
    # an export from a position continues the same chain
    tail = cli.run("audit", "export", "--after", str(records[2]["position"])).ok().stdout
    assert [json.loads(line) for line in tail.splitlines()] == records[3:]
    # and both verifiers say where it starts
    tail_path = tmp_path / "tail.jsonl"
    tail_path.write_text(tail)
    from_third = (f"chain intact: {len(records) - 3} events, head {records[-1]['hash']}"
                  f" (from position {records[3]['position']}, after prev_hash {records[2]['hash']})")
    assert cli.run("audit", "verify", "--file", str(tail_path)).ok().stdout.strip() == from_third
    script = _script(tail_path)
    assert (script.returncode, script.stdout.strip()) == (0, from_third), script.stderr


@pytest.mark.parametrize("edit", [_edit_byte, _edit_payload, _delete, _duplicate, _swap],
                         ids=["byte", "payload", "delete", "duplicate", "swap"])
def test_an_edited_export_fails_naming_the_first_bad_position(edit, store_url, tmp_path, make_container):
    _workload(make_container, store_url)
    cli = Cli(store_url, tmp_path)
    lines = cli.run("audit", "export").ok().stdout.splitlines()
    edited, position, kind = edit(lines)
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(edited) + "\n")

    verdict = cli.run("audit", "verify", "--file", str(path))
    assert verdict.code == 1 and "Traceback" not in verdict.stderr, str(verdict)
    assert verdict.stdout.startswith(f"chain broken at position {position}: {kind} ("), str(verdict)
    document = json.loads(cli.run("--json", "audit", "verify", "--file", str(path)).stdout)
    assert (document["intact"], document["position"], document["kind"], document["code"]) == (
        False, position, kind, "chain_broken")
    script = _script(path)
    assert script.returncode == 1 and script.stdout.startswith(f"chain broken at position {position}: {kind}"), script


# -- an export with its payloads ---------------------------------------------------------------


def _with_payloads(store_url, tmp_path, make_container) -> tuple[Cli, list[str], list[str]]:
    """The workload's export with and without `--payloads` (its lines, each way)."""
    _workload(make_container, store_url)
    cli = Cli(store_url, tmp_path)
    plain = cli.run("audit", "export").ok().stdout.splitlines()
    carried = cli.run("audit", "export", "--payloads").ok().stdout.splitlines()
    return cli, plain, carried


def test_an_export_with_its_payloads_carries_each_stored_payload_and_seals_the_same(store_url, tmp_path,
                                                                                     make_container):
    cli, plain, carried = _with_payloads(store_url, tmp_path, make_container)
    records = [json.loads(line) for line in carried]
    # every digest of content stored by reference is carried, keyed by its SHA-256; a secret never is
    for record in records:
        by_reference = {ref["sha256"] for name, ref in record.get("digests", {}).items() if name != "password_hash"}
        assert set(record.get("payloads", {})) == by_reference, record
    entries = [(r["type"], e["encoding"], e["content"]) for r in records for e in r.get("payloads", {}).values()]
    body, raw = '{"hello": "world",  "x": [1]}', base64.b64encode(b"\xff\xfe\x00 not utf-8").decode()
    assert sorted(entries, key=repr) == sorted([  # values as pushed; bodies as the exact bytes received
        ("TodoOpened", "json", {"n": 1, "text": "ünïcode", "f": 1.5e16}),
        ("TodoOpened", "json", [1, 2, {"b": None, "a": True}]),
        ("TodoCompleted", "json", {"ok": 1}), ("TodoFailed", "json", "broke"),
        ("DeliveryAccepted", "utf-8", body), ("TodoOpened", "utf-8", body),
        ("DeliveryAccepted", "base64", raw), ("TodoOpened", "base64", raw),
    ], key=repr)
    # the chain does not cover them: the same lines, the same hashes, with or without
    assert [{k: v for k, v in r.items() if k != "payloads"} for r in records] == [json.loads(line) for line in plain]
    path = tmp_path / "with-payloads.jsonl"
    path.write_text("\n".join(carried) + "\n")
    expected = f"chain intact: {len(records)} events, head {records[-1]['hash']}"
    assert cli.run("audit", "verify", "--file", str(path)).ok().stdout.strip() == expected
    script = _script(path)
    assert (script.returncode, script.stdout.strip()) == (0, expected), script.stderr


def _edit_entry(lines: list[str], encoding: str, change) -> tuple[list[str], int]:
    i = next(i for i, line in enumerate(lines) if f'"encoding":"{encoding}"' in line.replace(" ", ""))
    record = json.loads(lines[i])
    entry = next(e for e in record["payloads"].values() if e["encoding"] == encoding)
    entry["content"] = change(entry["content"])
    return lines[:i] + [json.dumps(record, ensure_ascii=False)] + lines[i + 1:], record["position"]


@pytest.mark.parametrize("encoding, change", [
    ("json", lambda value: {**value, "n": 2} if isinstance(value, dict) else value + [3]),
    ("utf-8", lambda text: text.replace("world", "World")),
    ("base64", lambda text: base64.b64encode(base64.b64decode(text) + b"!").decode()),
], ids=["json-value", "utf8-body", "base64-body"])
def test_an_edited_payload_in_an_export_fails_naming_its_position(encoding, change, store_url, tmp_path,
                                                                  make_container):
    cli, _, carried = _with_payloads(store_url, tmp_path, make_container)
    edited, position = _edit_entry(carried, encoding, change)
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(edited) + "\n")

    verdict = cli.run("audit", "verify", "--file", str(path))
    assert verdict.code == 1 and "Traceback" not in verdict.stderr, str(verdict)
    assert verdict.stdout.startswith(f"chain broken at position {position}: altered (payloads."), str(verdict)
    assert "does not match its digest" in verdict.stdout, str(verdict)
    script = _script(path)
    assert script.returncode == 1 and script.stdout.startswith(f"chain broken at position {position}: altered"), \
        script


# -- the store --------------------------------------------------------------------------------


def _tx(url: str, statements: list[tuple[str, tuple]]) -> None:
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            with conn:
                for sql, params in statements:
                    conn.execute(sql.replace("%s", "?"), params)
        finally:
            conn.close()
        return
    with psycopg.connect(url) as conn:
        for sql, params in statements:
            conn.execute(sql, params)


def _where(url: str) -> str:
    return "rowid = %s" if url.startswith("sqlite") else "notification_id = %s"


def _store_byte(url: str, positions: list[tuple[int, str]]) -> tuple[int, str]:
    at = next(p for p, topic in positions if topic == "TodoOpened")
    text = "CAST(replace(CAST(state AS TEXT), 'audited', 'audiTed') AS BLOB)" if url.startswith("sqlite") else \
        "convert_to(replace(convert_from(state, 'UTF8'), 'audited', 'audiTed'), 'UTF8')"
    _tx(url, [(f"UPDATE stored_events SET state = {text} WHERE {_where(url)}", (at,))])
    return at, "altered"


def _store_dropped_field(url: str, positions: list[tuple[int, str]]) -> tuple[int, str]:
    """A field whose value is its default taken out of a stored event: the line is the event as
    stored (no default is filled in), so this changes it."""
    at = next(p for p, topic in positions if topic == "TodoOpened")
    text = "CAST(replace(CAST(state AS TEXT), ',\"not_before\":null', '') AS BLOB)" if url.startswith("sqlite") else \
        "convert_to(replace(convert_from(state, 'UTF8'), ',\"not_before\":null', ''), 'UTF8')"
    _tx(url, [(f"UPDATE stored_events SET state = {text} WHERE {_where(url)}", (at,))])
    assert b"not_before" not in bytes(query(url, f"SELECT state FROM stored_events WHERE {_where(url)}" % at)[0][0])
    return at, "altered"


def _store_delete(url: str, positions: list[tuple[int, str]]) -> tuple[int, str]:
    at = positions[3][0]
    _tx(url, [(f"DELETE FROM stored_events WHERE {_where(url)}", (at,))])
    return at, "missing"


def _store_duplicate(url: str, positions: list[tuple[int, str]]) -> tuple[int, str]:
    """A copy of an event appended under a new position (the key that forbids it dropped first)."""
    at = positions[3][0]
    if url.startswith("sqlite"):
        _tx(url, [
            ("ALTER TABLE stored_events RENAME TO old_events", ()),
            ("CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER, topic TEXT, state BLOB)", ()),
            ("INSERT INTO stored_events (rowid, originator_id, originator_version, topic, state)"
             " SELECT rowid, originator_id, originator_version, topic, state FROM old_events", ()),
            ("DROP TABLE old_events", ()),
        ])
    else:
        _tx(url, [("ALTER TABLE stored_events DROP CONSTRAINT stored_events_pkey", ())])
    _tx(url, [("INSERT INTO stored_events (originator_id, originator_version, topic, state) SELECT originator_id,"
               f" originator_version, topic, state FROM stored_events WHERE {_where(url)}", (at,))])
    return positions[-1][0] + 1, "duplicated"


def _store_swap(url: str, positions: list[tuple[int, str]]) -> tuple[int, str]:
    """The contents of two positions exchanged (of two different aggregates)."""
    i, j = positions[2][0], positions[4][0]
    rows = {p: r for p, *r in query(url, "SELECT " + ("rowid" if url.startswith("sqlite") else "notification_id")
                                     + ", originator_id, originator_version, topic, state FROM stored_events"
                                     + f" WHERE {_where(url).split(' =')[0]} IN ({i}, {j})")}
    parked = uuid.uuid4().hex if url.startswith("sqlite") else uuid.uuid4()
    update = f"UPDATE stored_events SET originator_id = %s, originator_version = %s, topic = %s, state = %s WHERE {_where(url)}"
    _tx(url, [(update, (parked, 1, rows[i][2], rows[i][3], i)), (update, (*rows[i], j)), (update, (*rows[j], i))])
    return i, "out of order"


@pytest.mark.parametrize("tamper", [_store_byte, _store_dropped_field, _store_delete, _store_duplicate, _store_swap],
                         ids=["byte", "dropped-field", "delete", "duplicate", "swap"])
def test_tampering_with_the_store_fails_verify_naming_the_first_bad_position(tamper, store_url, tmp_path,
                                                                             make_container):
    container = _workload(make_container, store_url)
    container.audit.seal()
    cli = Cli(store_url, tmp_path)
    cli.run("audit", "verify").ok()
    positions = _positions(store_url)
    assert len({r[1] for r in query(store_url, "SELECT originator_id, topic FROM stored_events")}) > 1

    position, kind = tamper(store_url, positions)

    verdict = cli.run("audit", "verify")
    assert verdict.code == 1 and "Traceback" not in verdict.stderr, str(verdict)
    assert verdict.stdout.startswith(f"chain broken at position {position}: {kind} ("), str(verdict)
    document = json.loads(cli.run("--json", "audit", "verify").stdout)
    assert (document["position"], document["kind"]) == (position, kind)
    # an export of the tampered store says the same, with the hashes sealed before the tampering
    path = tmp_path / "export.jsonl"
    path.write_text(cli.run("audit", "export").ok().stdout)
    from_file = cli.run("audit", "verify", "--file", str(path))
    assert from_file.code == 1 and from_file.stdout.startswith(f"chain broken at position {position}: {kind} ("), \
        str(from_file)


def test_an_event_that_cannot_be_read_is_named_by_verify_and_stops_export_with_a_clear_error(
        sqlite_url, tmp_path, make_container):
    container = _workload(make_container, sqlite_url)
    container.audit.seal()
    at = _positions(sqlite_url)[2][0]
    execute_sql(sqlite_url, f"UPDATE stored_events SET state = X'7b7b7b' WHERE rowid = {at}")  # '{{{'
    cli = Cli(sqlite_url, tmp_path)

    verdict = cli.run("audit", "verify")
    assert verdict.code == 1 and "Traceback" not in verdict.stderr, str(verdict)
    assert verdict.stdout.startswith(f"chain broken at position {at}: altered (its stored data is not readable"), str(verdict)
    export = cli.run("audit", "export")
    assert export.code == 1 and "Traceback" not in export.stderr, str(export)
    assert export.stderr.startswith(f"error: chain_broken: chain broken at position {at}: altered"), str(export)
    assert len(export.stdout.splitlines()) == 2  # the lines before it


def test_verify_file_refuses_what_is_not_an_export_with_a_clear_error(tmp_path):
    cli = Cli(None, tmp_path)
    missing = cli.run("audit", "verify", "--file", str(tmp_path / "nope.jsonl"))
    assert missing.refused("invalid_argument").startswith("cannot read export file")
    (tmp_path / "junk.jsonl").write_text("not json\n")
    junk = cli.run("audit", "verify", "--file", str(tmp_path / "junk.jsonl"))
    assert junk.code == 1 and junk.stdout.startswith("chain broken: altered (line 1 is not JSON"), str(junk)
    (tmp_path / "other.jsonl").write_text('{"a": 1}\n')
    other = cli.run("audit", "verify", "--file", str(tmp_path / "other.jsonl"))
    assert other.code == 1 and "line 1 is not an export line" in other.stdout, str(other)
    (tmp_path / "empty.jsonl").write_text("")
    assert cli.run("audit", "verify", "--file", str(tmp_path / "empty.jsonl")).ok().stdout.strip() == (
        "chain intact: 0 events, head " + "0" * 64)


def test_a_standby_sealer_seals_only_what_its_primary_has_left_waiting(sqlite_url, make_container):
    """`serve`'s own sealer stands by for its projector process's (docs/adr/0032): it reads only
    the head and the log's end while the primary keeps up, and seals what has waited
    STANDBY_AFTER seconds unsealed."""
    from application.audit import STANDBY_AFTER, Sealer

    container = make_container(sqlite_url)
    app, audit = container.app, container.audit
    app.ensure_admin()
    slug = app.vend("standby", queues=["q"], caller=Caller.cli())["slug"]
    now = [100.0]
    standby = Sealer(audit, standby=STANDBY_AFTER, monotonic=lambda: now[0])
    primary = Sealer(audit)
    audit.seal()
    head = audit.head()["position"]

    def step(seconds: float) -> int:
        now[0] += seconds
        standby.tick()
        return audit.head()["position"]

    app.push(slug, "one", caller=Caller.cli(), payload={"n": 1})
    assert step(0) == head  # seen waiting, not sealed
    assert step(STANDBY_AFTER / 2) == head
    primary.tick()  # the primary seals it in time
    sealed = audit.head()["position"]
    assert sealed > head
    app.push(slug, "two", caller=Caller.cli(), payload={"n": 2})
    assert step(STANDBY_AFTER * 0.6) == sealed  # seen waiting from now: the time before is not its
    assert step(STANDBY_AFTER * 0.6) == sealed
    assert step(STANDBY_AFTER * 0.5) == audit.behind()[1] > sealed  # the primary is gone: sealed here
    assert step(STANDBY_AFTER * 10) == audit.behind()[1]  # nothing waiting: nothing to do
