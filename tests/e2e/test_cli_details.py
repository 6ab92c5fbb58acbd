"""End to end: the details users tripped over on the CLI (CONTRACT §15), on SQLite and PostgreSQL.

Listings that continue by cursor, rule files named by path or @path, $params refused alike,
payloads in `todo history` shown by size and digest, delivery ids in `events list`, bodies
in `events show`.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from application.service import Caller
from tests.e2e._support import Cli
from tests.fixtures import fixture, sign

CLI = Caller.cli()


def _seed(make_container, url: str):
    container = make_container(url)
    container.app.ensure_admin()
    vended = container.app.vend("details", queues=["work", "other"], caller=CLI)
    return container, vended


def _github_hook(container, vended) -> dict:
    return container.webhooks.create(caller=CLI, endpoint=vended["slug"], source_type="github", target_queue="work")


def _deliver(container, hook, body: bytes, *, event: str = "issues", delivery: str | None = None,
             content_type: str = "application/json") -> dict:
    headers = {"Content-Type": content_type, "X-GitHub-Event": event,
               "X-GitHub-Delivery": delivery or str(uuid.uuid4()), **sign("github", hook["signing_secret"], body)}
    return container.webhooks.ingest(hook["ingest_url"].rsplit("/", 1)[1], headers, body, remote_addr="192.0.2.1")


def _write(path, document) -> str:
    path.write_text(json.dumps(document))
    return str(path)


# -- rule files: path or @path, failures that name the path, one candidate shape ------------------


def test_rule_files_are_read_from_a_path_or_at_path_and_a_failure_names_the_path(store_url, tmp_path,
                                                                                  make_container):
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    hook = _github_hook(container, vended)
    wid = hook["webhook_id"]
    rules = {"rules": [{"id": "drop-pings", "expr": '.kind == "ping"', "action": {"drop": True}}],
             "default_action": None, "params": {}}
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "rules.json", rules)
    candidate = {"rules": [{"id": "flagged", "expr": "$params.flag == true", "action": {"queue": "other"}}],
                 "params": {"flag": True}}
    _write(tmp_path / "candidate.json", candidate)
    (tmp_path / "broken.json").write_text('{"rules": [')
    _write(tmp_path / "bad-params.json", {"rules": [], "params": "nope"})

    by_path, by_at = cli.run_all(("rules", "set", wid, "--file", "rules.json", "--json"),
                                 ("rules", "set", wid, "--file", f"@{tmp_path}/rules.json", "--json"))
    assert by_path.json() == by_at.json() == {"webhook_id": wid, **rules}

    # what `rules get` prints reads back as a rules file and as a candidate: with --json, and without
    # it (the rules document alone, as JSON: docs/reference.md)
    (tmp_path / "got.json").write_text(cli.run("rules", "get", wid, "--json").ok().stdout)
    assert cli.json("rules", "set", wid, "--file", "got.json") == {"webhook_id": wid, **rules}
    as_text = cli.run("rules", "get", wid).ok().stdout
    assert json.loads(as_text) == rules
    assert json.loads(cli.run("rules", "set", wid, "--file", "got.json").ok().stdout) == rules
    (tmp_path / "got-text.json").write_text(as_text)
    assert cli.json("rules", "set", wid, "--file", "got-text.json") == {"webhook_id": wid, **rules}

    ping = json.dumps({"zen": "Keep it logically awesome."})
    tested = [cli.run("rules", "test", wid, "--json", "--payload", ping, "--header", "X-GitHub-Event:ping",
                      "--rules", given) for given in ("candidate.json", "@candidate.json", "sub/../candidate.json",
                                                      json.dumps(candidate))]
    for result in tested:
        assert result.json()["decision"]["queue"] == "other", str(result)
    assert cli.json("rules", "replay", wid, "--rules", "candidate.json")["evaluated"] == 0
    assert cli.json("rules", "replay", wid, "--rules", "got.json")["evaluated"] == 0

    missing_file, missing_rules, missing_at, broken, broken_inline = cli.run_all(
        ("rules", "set", wid, "--file", "../nowhere/rules.json"),
        ("rules", "test", wid, "--payload", "{}", "--rules", "../rules.json"),
        ("rules", "replay", wid, "--rules", "@missing.json"),
        ("rules", "set", wid, "--file", "broken.json"),
        ("rules", "test", wid, "--payload", "{}", "--rules", '{"rules": ['),
    )
    assert missing_file.refused("invalid_argument") == (
        "cannot read rules file ../nowhere/rules.json: No such file or directory")
    assert missing_rules.refused("invalid_argument") == "cannot read rules file ../rules.json: No such file or directory"
    assert missing_at.refused("invalid_argument") == "cannot read rules file missing.json: No such file or directory"
    assert broken.refused("invalid_argument").startswith("rules file broken.json is not valid JSON: ")
    assert broken_inline.refused("invalid_argument").startswith("rules is not valid JSON: ")

    # $params that is not a JSON object is invalid_params here too
    set_bad, test_bad = cli.run_all(("rules", "set", wid, "--file", "bad-params.json"),
                                    ("rules", "test", wid, "--payload", "{}", "--rules", "bad-params.json"))
    assert set_bad.refused("invalid_params") == "params must be a JSON object"
    assert test_bad.refused("invalid_params") == "params must be a JSON object"
    assert container.webhooks.rules(wid, caller=CLI) == {"webhook_id": wid, **rules}


# -- long listings ---------------------------------------------------------------------------------


def _follow(cli, *args: str) -> tuple[list[str], list[str]]:
    """Every row id of a text listing, following the stderr hint page by page; and the hints."""
    seen, hints, command = [], [], list(args)
    while True:
        result = cli.run(*command).ok()
        seen += [line.split()[0] for line in result.stdout.splitlines()[1:]]
        if not result.stderr:
            return seen, hints
        (hint,) = result.stderr.splitlines()  # one line, saying how to get the rest
        hints.append(hint)
        assert hint.startswith("more "), hint
        command = hint.split("next page: switchboard ", 1)[1].split()


def test_todo_list_says_how_to_get_the_rest_and_continues_by_cursor(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    for n in range(121):
        container.app.push(vended["slug"], f"todo {n}", caller=CLI)
    expected = [r["id"] for r in container.app.list_todos(caller=CLI, endpoint=vended["slug"], limit=1000)]

    first = cli.run("todo", "list", "--endpoint", vended["slug"]).ok()
    assert len(first.stdout.splitlines()) == 51
    assert first.stderr.startswith("more todos than the 50 shown; next page: switchboard todo list --endpoint ")
    seen, hints = _follow(cli, "todo", "list", "--endpoint", vended["slug"])
    assert seen == expected and len(hints) == 2

    pages, cursor = [], None
    while True:
        page = cli.json("todo", "list", "--endpoint", vended["slug"], *(["--cursor", cursor] if cursor else []))
        pages.append([r["id"] for r in page["todos"]])
        cursor = page.get("next_cursor")
        if cursor is None:
            break
    assert [len(p) for p in pages] == [50, 50, 21] and sum(pages, []) == expected
    everything = cli.run("todo", "list", "--limit", "1000").ok()
    assert everything.stderr == "" and len(everything.stdout.splitlines()) == 122
    cli.run("todo", "list", "--cursor", "nonsense").refused("invalid_argument")


def test_events_list_shows_delivery_ids_pages_by_cursor_and_events_show_prints_the_body(store_url, tmp_path,
                                                                                        make_container):
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    hook = _github_hook(container, vended)
    generic = container.webhooks.create(caller=CLI, endpoint=vended["slug"], source_type="generic",
                                        target_queue="work")
    body = fixture("github_issues_opened.json")
    first = _deliver(container, hook, body, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    second = _deliver(container, hook, b"Disk full on web-3\n", content_type="text/plain")
    plain = b'{"title": "no id"}'
    third = container.webhooks.ingest(generic["ingest_url"].rsplit("/", 1)[1], {"Content-Type": "application/json"},
                                      plain, remote_addr="192.0.2.2")

    listed = cli.json("events", "list")
    rows = {row["id"]: row for row in listed["events"]}
    assert rows[first["event_id"]]["delivery_id"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert rows[third["event_id"]]["delivery_id"] == "sha256:" + hashlib.sha256(plain).hexdigest()
    table = cli.run("events", "list", "--webhook", hook["webhook_id"]).ok().stdout.splitlines()
    assert table[0].split()[:2] == ["ID", "DELIVERY_ID"]
    assert table[2].split()[:2] == [first["event_id"], "72d3162e-cc78-11e3-81ab-4c9367dc0958"]

    seen, hints = _follow(cli, "events", "list", "--limit", "2")
    assert seen == [third["event_id"], second["event_id"], first["event_id"]] and len(hints) == 1
    assert hints[0].startswith("more events than the 2 shown; next page: switchboard events list --limit 2 --cursor ")
    page = cli.json("events", "list", "--limit", "2")
    assert [e["id"] for e in cli.json("events", "list", "--limit", "2", "--cursor", page["next_cursor"])["events"]] == [
        first["event_id"]]

    shown = cli.run("events", "show", first["event_id"]).ok().stdout
    assert "delivery_id: 72d3162e-cc78-11e3-81ab-4c9367dc0958" in shown
    assert f"body ({len(body):,} bytes):" in shown
    assert json.loads(shown.split(f"body ({len(body):,} bytes):\n", 1)[1]) == json.loads(body)
    assert "  x-hub-signature-256: «redacted»" in shown
    text = cli.run("events", "show", second["event_id"]).ok().stdout
    assert text.endswith("body (19 bytes):\nDisk full on web-3\n\n")
    detail = cli.json("events", "show", first["event_id"])
    assert detail["delivery_id"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958" and detail["payload"] == json.loads(body)
    # the todo a body that is not JSON opened says what it is
    todo = container.app.get_todo(second["id"], caller=CLI)
    assert todo["title"] == "issues: not JSON, 19 bytes (text/plain): Disk full on web-3"


def test_events_show_prints_a_json_body_as_received_not_reformatted(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    hook = _github_hook(container, vended)
    body = b'{"title":"one","n":1.0e3,"z":1,"a":2}\n'  # compact, a float as sent, keys not sorted
    answer = _deliver(container, hook, body)
    text = cli.run("events", "show", answer["event_id"]).ok().stdout
    assert text.endswith(f"body ({len(body)} bytes):\n{body.decode()}\n"), text
    detail = cli.json("events", "show", answer["event_id"])  # --json unchanged: the parsed payload
    assert detail["payload"] == json.loads(body) and detail["body"] is None


# -- history ---------------------------------------------------------------------------------------


def test_todo_history_text_shows_payloads_by_size_and_digest_and_json_shows_them_whole(store_url, tmp_path,
                                                                                       make_container):
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    payload = {"blob": "é" * 11_000}
    todo = container.app.push(vended["slug"], "big one", caller=CLI, payload=payload)["todo"]
    agent = Caller("endpoint", vended["slug"])
    container.app.claim(todo["id"], caller=agent)
    container.app.complete(todo["id"], caller=agent, result={"ok": True}, summary="done")
    encoded = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()

    text = cli.run("todo", "history", todo["id"]).ok().stdout
    assert len(text) < 2000 and "éééé" not in text
    assert f"payload: {len(encoded):,} bytes, sha256 {hashlib.sha256(encoded).hexdigest()}" in text
    assert "payload: 22,011 bytes, sha256 " in text
    result = json.dumps({"ok": True}, separators=(",", ":")).encode()
    assert f"result: {len(result)} bytes, sha256 {hashlib.sha256(result).hexdigest()}" in text
    lines = text.splitlines()
    assert "TodoOpened" in lines[0] and lines[1].strip().startswith("payload: ")
    whole = cli.json("todo", "history", todo["id"])
    assert whole["events"][0]["data"]["payload"] == payload
    assert whole["events"][-1]["data"]["result"] == {"ok": True}


def test_todo_history_digests_are_those_of_the_stored_bytes_as_the_audit_export_names_them(
        store_url, tmp_path, make_container):
    """A delivery's todo: the raw body's size and SHA-256 (not a re-encoding of the parsed JSON);
    a push: its canonical JSON's, whatever the order of its keys. The same in the JSON `digests`,
    in the audit export, and after a prune in its note."""
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    hook = _github_hook(container, vended)
    body = fixture("github_issues_opened.json")
    delivered = _deliver(container, hook, body)["todos"][0]["id"]
    pushed = container.app.push(vended["slug"], "keys out of order", caller=CLI, payload={"b": 1, "a": 2})["todo"]["id"]
    canonical = b'{"a":2,"b":1}'

    for todo_id, stored in ((delivered, body), (pushed, canonical)):
        expected = f"payload: {len(stored):,} bytes, sha256 {hashlib.sha256(stored).hexdigest()}"
        assert expected in cli.run("todo", "history", todo_id).ok().stdout
        opened = cli.json("todo", "history", todo_id)["events"][0]
        assert opened["digests"] == {"payload": {"sha256": hashlib.sha256(stored).hexdigest(), "size": len(stored)}}
    assert container.app.get_todo(delivered, caller=CLI)["payload_size"] == len(body)
    exported = [json.loads(line) for line in cli.run("audit", "export").ok().stdout.splitlines() if line.strip()]
    named = {r["digests"]["payload"]["sha256"] for r in exported if r.get("type") == "TodoOpened"}
    assert {hashlib.sha256(body).hexdigest(), hashlib.sha256(canonical).hexdigest()} <= named


def test_rules_test_text_numbers_rules_from_one_and_says_why_a_fault_happened(store_url, tmp_path, make_container):
    cli = Cli(store_url, tmp_path)
    container, vended = _seed(make_container, store_url)
    hook = _github_hook(container, vended)
    _write(tmp_path / "candidate.json", {"rules": [
        {"id": "pings", "expr": '.kind == "ping"', "action": {"drop": True}},
        {"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "other"}},
        {"id": "boom", "expr": 'if .kind == "push" then error("no pushes here") else false end',
         "action": {"drop": True}},
    ]})
    second, fault, default = (  # one at a time: side by side, a busy machine can blow a 50 ms rule budget
        cli.run("rules", "test", hook["webhook_id"], "--payload", "{}", "--header", f"X-GitHub-Event:{kind}",
                "--rules", "candidate.json") for kind in ("issues", "push", "star"))
    assert second.ok().stdout.splitlines()[:2] == [f"decision: queue:other on {vended['endpoint_id']}",
                                                   "matched: rule #2 (issues)"]
    assert '"rule_index": 1' in second.stdout  # the trace itself still counts from 0
    assert fault.ok().stdout.splitlines()[1] == "fault: error in rule #3 (boom): no pushes here"
    assert default.ok().stdout.splitlines()[:2] == [f"decision: queue:work on {vended['endpoint_id']}",
                                                    "matched: no rule (the default action)"]
    # refusals name rules the same way
    _write(tmp_path / "bad.json", {"rules": [{"id": "ok", "expr": "true", "action": {"drop": True}},
                                             {"id": "broken", "expr": ".payload | ((", "action": {"drop": True}}]})
    message = cli.run("rules", "set", hook["webhook_id"], "--file", "bad.json").refused("invalid_expression")
    assert message.startswith("rule #2 (broken): does not compile")
