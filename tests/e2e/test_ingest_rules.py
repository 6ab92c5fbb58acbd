"""End to end: routing rules and the CLI around ingest, against a real `switchboard serve`
(CONTRACT §2, §4, §5, §11).

- a pathological rule quarantines the delivery while the server keeps answering /healthz fast;
- every rule-save refusal through `switchboard rules set` leaves the saved rules in force;
- `rules test`, `rules replay`, `events list/show`, `webhook create/rotate/delete` via the CLI.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from domain.errors import DomainError
from tests.e2e._ingest import (
    CLI, EVENT_ID, REDACTED, REFUSED_401, UNKNOWN_404, Stack, assert_accepted, assert_error,
)
from tests.fixtures import fixture, hmac_hex, sign

QUEUES = ("inbox", "reviews", "triage")
HEALTHZ_BUDGET = 0.100  # seconds


@pytest.fixture(scope="module")
def stack(module_store_url, tmp_path_factory):
    stack = Stack(module_store_url, tmp_path_factory.mktemp("rules")).start()
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def owner(stack):
    return stack.vend("rules-owner", QUEUES, webhook_max=20)


GITHUB_RULES = {
    "rules": [
        {"id": "drop-pings", "expr": '.kind == "ping"', "action": {"drop": True}},
        {"id": "prs-opened", "expr": '.kind == "pull_request" and .payload.action == "opened"',
         "action": {"queue": "reviews"}},
        {"id": "label-bug", "expr": '.kind == "issues" and .payload.action == "labeled" and .payload.label.name == "bug"',
         "action": {"queue": "triage"}},
    ],
    "default_action": None,
    "params": {},
}


def _write(tmp_path, document) -> str:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(document))
    return str(path)


# -- 4. a pathological rule ---------------------------------------------------------------------


class HealthzPoller(threading.Thread):
    """GET /healthz in a loop on its own connection, timing every answer."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.stop = threading.Event()
        self.samples: list[tuple[float, float, int]] = []  # (started, seconds, status)

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                status = client.get(f"{self.base}/healthz").status_code
                self.samples.append((started, time.monotonic() - started, status))
                time.sleep(0.005)


@pytest.mark.parametrize("expr", ["[range(1e9)] | length > 0", "def f: f; f"], ids=["huge-range", "recursion"])
def test_pathological_rule_quarantines_while_healthz_stays_fast(stack, expr, tmp_path):
    owner = stack.vend("slow-owner", QUEUES)
    other = stack.vend("slow-other", QUEUES)
    hook = stack.webhook(owner, "generic", "inbox")
    stack.webhooks.add_route(hook["webhook_id"], other["endpoint_id"], caller=CLI)
    rules = {"rules": [
        {"id": "slow", "expr": expr, "action": {"queue": "triage"}},
        {"id": "everything", "expr": "true", "action": {"queue": "reviews"}},
    ], "default_action": None, "params": {}}
    # no deliveries yet, so the save-time dry run has nothing to run on: the save goes through
    assert stack.cli.json("rules", "set", hook["webhook_id"], "--file", _write(tmp_path, rules))["rules"] == rules["rules"]

    poller = HealthzPoller(stack.server.base)
    poller.start()
    time.sleep(0.05)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        responses = list(pool.map(
            lambda i: stack.post(hook["ingest_url"], json.dumps({"title": f"slow {i}"}).encode(),
                                 {"content-type": "application/json", "x-delivery-id": f"slow-{i}"}),
            range(3)))
    finished = time.monotonic()
    time.sleep(0.05)
    poller.stop.set()
    poller.join(timeout=5)

    trace = {"stage": "fault", "rule_index": 0, "rule_id": "slow", "reason": "timeout",
             "detail": "rule #1 did not finish within its time budget", "action": {"queue": "quarantine"}}
    for response in responses:
        answer = assert_accepted(response, trust_mode="token", verified=False, queue="quarantine", created=1,
                                 endpoint_ids=[owner["endpoint_id"]])  # the owner only, never the route
        assert answer["faulted"] is True and "dropped" not in answer
        todo = stack.app.get_todo(answer["id"], caller=CLI)
        assert (todo["queue"], todo["state"], todo["routing"]) == ("quarantine", "pending", trace)
        stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
        assert (stored["disposition"], stored["routing"]) == ("faulted", trace)

    during = [s for s in poller.samples if started <= s[0] <= finished]
    assert len(during) >= 3, (finished - started, poller.samples)
    assert all(status == 200 for _, _, status in poller.samples), poller.samples
    slowest = max(seconds for _, seconds, _ in poller.samples)
    assert slowest <= HEALTHZ_BUDGET, f"/healthz took {slowest * 1000:.0f} ms while rules ran"

    # operators see the quarantine; the agents never do, and cannot claim from it
    quarantined = stack.cli.json("todo", "list", "--endpoint", owner["slug"], "--queue", "quarantine")["todos"]
    assert sorted(t["id"] for t in quarantined) == sorted(r.json()["id"] for r in responses)
    assert stack.todos_of(other) == []
    agent = stack.app.endpoint_caller(owner["slug"])
    assert stack.app.list_todos(caller=agent) == []
    assert stack.app.claim_next(caller=agent) == {"empty": True}
    # now that deliveries are stored, the same rules are refused by the save-time dry run
    refused = stack.cli.run("rules", "set", hook["webhook_id"], "--file", _write(tmp_path, rules))
    message = refused.refused("invalid_argument")
    assert "rule #1 (slow)" in message
    assert any(r.json()["event_id"] in message for r in responses), message


# -- 5. every rule-save refusal leaves the saved rules in force ---------------------------------


def _rule(rule_id: str, expr: str = "true", action=None) -> dict:
    return {"id": rule_id, "expr": expr, "action": action or {"queue": "triage"}}


def _ok_rules(*extra: dict) -> dict:
    return {"rules": [_rule("first", '.kind == "ping"'), *extra]}


# through `switchboard rules set` (every code); the other cases through the application layer
CLI_CASES = {"33 rules", "unknown action key", "does not compile", "$ENV", "params not an object", "params a string",
             "queue outside the grant", "endpoint not a target", "faults on a stored delivery"}


def _refusals(other_endpoint_id: str) -> list[tuple[str, str, dict, tuple[str, ...]]]:
    """(case, code, document, fragments the message must name)."""
    return [
        ("33 rules", "too_many_rules", {"rules": [_rule(f"r{i}") for i in range(33)]}, ("33 rules",)),
        ("unknown action key", "invalid_rule",
         _ok_rules(_rule("bad-action", action={"queue": "triage", "priority": 1})), ("rule #2 (bad-action)",)),
        ("does not compile", "invalid_expression", _ok_rules(_rule("broken", ".payload | ((")),
         ("rule #2 (broken)",)),
        ("$ENV", "forbidden_function", _ok_rules(_rule("peek", "$ENV.HOME != null")), ("rule #2 (peek)", "$ENV")),
        ("params not an object", "invalid_params", {**_ok_rules(), "params": [1, 2]}, ("params",)),
        ("params a string", "invalid_params", {**_ok_rules(), "params": "nope"}, ("params must be a JSON object",)),
        ("queue outside the grant", "forbidden", _ok_rules(_rule("elsewhere", action={"queue": "payroll"})),
         ("rule #2 (elsewhere)", "payroll")),
        ("faults on a stored delivery", "invalid_argument",
         _ok_rules(_rule("explodes", 'if .kind == "issues" then error("boom") else false end')),
         ("rule #2 (explodes)", "boom")),
        # more of each
        ("quarantine as a queue", "invalid_rule",
         _ok_rules(_rule("to-quarantine", action={"queue": "quarantine"})), ("rule #2 (to-quarantine)",)),
        ("duplicate id", "invalid_rule", _ok_rules(_rule("first")), ("rule #2 (first)", "duplicate")),
        ("bad id", "invalid_rule", _ok_rules(_rule("has space")), ("rule #2",)),
        ("no action", "invalid_rule", _ok_rules({"id": "no-action", "expr": "true"}), ("rule #2 (no-action)",)),
        ("drop false", "invalid_rule", _ok_rules(_rule("half-drop", action={"drop": False})),
         ("rule #2 (half-drop)",)),
        ("expr too long", "invalid_rule", _ok_rules(_rule("long", "true or " * 600 + "true")), ("rule #2 (long)",)),
        ("env", "forbidden_function", _ok_rules(_rule("peek", "env | length > 0")), ("rule #2 (peek)", "env")),
        ("input", "forbidden_function", _ok_rules(_rule("more", "[., input] | length > 1")),
         ("rule #2 (more)", "input")),
        ("debug in a string", "forbidden_function", _ok_rules(_rule("chatty", '"\\(debug)" | length > 0')),
         ("rule #2 (chatty)", "debug")),
        ("params too large", "invalid_params", {**_ok_rules(), "params": {"blob": "x" * (16 * 1024)}},
         ("params",)),
        ("default action outside the grant", "forbidden", {**_ok_rules(), "default_action": {"queue": "payroll"}},
         ("default action",)),
        ("endpoint not a target", "forbidden",
         _ok_rules(_rule("sideways", action={"queue": "triage", "endpoints": [other_endpoint_id]})),
         ("rule #2 (sideways)", other_endpoint_id)),
        ("unknown document field", "invalid_argument", {**_ok_rules(), "priority": 1}, ("priority",)),
        ("times out on a stored delivery", "invalid_argument",
         _ok_rules(_rule("spins", "[range(1e9)] | length > 0")), ("rule #2 (spins)", "timeout")),
    ]


def test_rule_save_refusals_leave_the_saved_rules_in_force(stack, owner, tmp_path):
    hook = stack.webhook(owner, "github", "inbox")
    stranger = stack.vend("stranger", QUEUES)
    saved = stack.cli.json("rules", "set", hook["webhook_id"], "--file", _write(tmp_path, GITHUB_RULES))
    assert saved == {"webhook_id": hook["webhook_id"], **GITHUB_RULES}
    stored = assert_accepted(stack.deliver(hook, fixture("github_issues_opened.json"), event="issues"),
                             trust_mode="signed", verified=True, queue="inbox", created=1)

    cases = _refusals(stranger["endpoint_id"])
    by_cli = [case for case in cases if case[0] in CLI_CASES]
    assert {code for _, code, _, _ in by_cli} == {code for _, code, _, _ in cases}
    results = stack.cli.run_all(*(("rules", "set", hook["webhook_id"], "--file", _write(tmp_path, document))
                                  for _, _, document, _ in by_cli))
    for (case, code, _, fragments), result in zip(by_cli, results):
        message = result.refused(code)
        for fragment in fragments:
            assert fragment in message, (case, message)
        if case == "faults on a stored delivery":
            assert stored["event_id"] in message, message  # names the delivery it faulted on
    for case, code, document, fragments in cases:
        if case in CLI_CASES:
            continue
        with pytest.raises(DomainError) as refused:
            stack.webhooks.set_rules(hook["webhook_id"], document, caller=CLI)
        assert refused.value.code == code, (case, refused.value)
        for fragment in fragments:
            assert fragment in refused.value.message, (case, refused.value.message)

    # --json: the refusal as one JSON document too
    stack.cli.run("rules", "set", hook["webhook_id"], "--json", "--file", _write(tmp_path, cases[0][2])).refused(
        "too_many_rules", as_json=True)

    assert stack.cli.json("rules", "get", hook["webhook_id"]) == {"webhook_id": hook["webhook_id"], **GITHUB_RULES}
    # ... and they still route
    ping = stack.deliver(hook, fixture("github_ping.json"), event="ping")
    assert assert_accepted(ping, trust_mode="signed", verified=True, queue=None, created=0)["dropped"] is True
    pr = stack.deliver(hook, fixture("github_pull_request_opened.json"), event="pull_request")
    assert_accepted(pr, trust_mode="signed", verified=True, queue="reviews", created=1)


# -- 6. the CLI around ingest -------------------------------------------------------------------


def test_rules_test_and_replay(stack, owner, tmp_path):
    hook = stack.webhook(owner, "github", "inbox")
    stack.set_rules(hook, GITHUB_RULES)
    cli, webhook_id = stack.cli, hook["webhook_id"]
    pr_file = tmp_path / "pr.json"
    pr_file.write_bytes(fixture("github_pull_request_opened.json"))
    candidate = {"rules": [{"id": "everything-but-pushes", "expr": '.kind != "push"', "action": {"queue": "triage"}}]}
    candidate_file = _write(tmp_path, candidate)
    faulty = json.dumps({"rules": [{"id": "bad", "expr": 'error("nope")', "action": {"queue": "triage"}}]})

    # --payload (@file or inline) with --header: saved or candidate rules; nothing is saved
    tested, ping, with_candidate, faulting, neither, both = cli.run_all(
        ("rules", "test", webhook_id, "--json", "--payload", f"@{pr_file}",
         "--header", "X-GitHub-Event:pull_request", "--header", "X-Hub-Signature-256: sha256=abc"),
        ("rules", "test", webhook_id, "--json", "--payload", '{"zen": "Keep it logically awesome."}',
         "--header", "X-GitHub-Event:ping"),
        ("rules", "test", webhook_id, "--json", "--payload", f"@{pr_file}", "--header", "X-GitHub-Event:pull_request",
         "--rules", f"@{candidate_file}"),
        ("rules", "test", webhook_id, "--json", "--payload", "{}", "--rules", faulty),
        ("rules", "test", webhook_id),
        ("rules", "test", webhook_id, "--payload", "{}", "--event", "ev_x"),
    )
    tested = tested.json()
    assert tested["decision"] == {"drop": False, "queue": "reviews", "endpoints": [owner["endpoint_id"]],
                                  "faulted": False}
    assert tested["trace"] == {"stage": "rule", "rule_index": 1, "rule_id": "prs-opened", "action": {"queue": "reviews"}}
    envelope = tested["envelope"]
    assert (envelope["source"], envelope["kind"], envelope["webhook_id"]) == ("github", "pull_request", webhook_id)
    assert (envelope["trust_mode"], envelope["verified"]) == ("signed", True)
    assert envelope["headers"] == {"x-github-event": "pull_request", "x-hub-signature-256": REDACTED}
    assert envelope["payload"] == json.loads(fixture("github_pull_request_opened.json"))
    assert ping.json()["decision"] == {"drop": True, "queue": None, "endpoints": [], "faulted": False}
    with_candidate = with_candidate.json()
    assert with_candidate["decision"]["queue"] == "triage"
    assert with_candidate["trace"]["rule_id"] == "everything-but-pushes"
    faulting = faulting.json()
    assert faulting["decision"] == {"drop": False, "queue": "quarantine", "endpoints": [owner["endpoint_id"]],
                                    "faulted": True}
    assert faulting["trace"] == {"stage": "fault", "rule_index": 0, "rule_id": "bad", "reason": "error",
                                 "detail": "nope", "action": {"queue": "quarantine"}}
    neither.usage()
    both.usage()
    assert stack.events_of(hook) == []  # a dry run stores nothing

    # six real deliveries under the saved rules, oldest first
    sent: dict[str, list[str]] = {}
    for name, event in (("github_issues_opened.json", "issues"), ("github_ping.json", "ping"),
                        ("github_pull_request_opened.json", "pull_request"), ("github_issues_labeled.json", "issues"),
                        ("github_ping.json", "ping"), ("github_push.json", "push")):
        response = stack.deliver(hook, fixture(name), event=event)
        assert response.status_code == 202, response.text
        sent.setdefault(name, []).append(response.json()["event_id"])
    ping_event = sent["github_ping.json"][1]

    by_event, by_event_candidate, by_event_text, unknown_event, replay, everything, replay_text, bad_last = cli.run_all(
        ("rules", "test", webhook_id, "--json", "--event", ping_event),
        ("rules", "test", webhook_id, "--json", "--event", ping_event, "--rules", f"@{candidate_file}"),
        ("rules", "test", webhook_id, "--event", ping_event),
        ("rules", "test", webhook_id, "--event", "ev_" + "0" * 32),
        ("rules", "replay", webhook_id, "--json", "--rules", f"@{candidate_file}", "--last", "4"),
        ("rules", "replay", webhook_id, "--json", "--rules", f"@{candidate_file}"),
        ("rules", "replay", webhook_id, "--rules", f"@{candidate_file}", "--last", "4"),
        ("rules", "replay", webhook_id, "--rules", f"@{candidate_file}", "--last", "0"),
    )
    # --event: a stored delivery, under the saved or the candidate rules
    by_event = by_event.json()
    assert by_event["decision"]["drop"] is True and by_event["trace"]["rule_id"] == "drop-pings"
    assert by_event["envelope"]["kind"] == "ping" and by_event["envelope"]["headers"]["x-hub-signature-256"] == REDACTED
    assert by_event_candidate.json()["decision"]["queue"] == "triage"
    # text: the rule numbered from 1, as people count (the trace's rule_index counts from 0)
    lines = by_event_text.ok().stdout.splitlines()
    assert lines[:2] == ["decision: drop", "matched: rule #1 (drop-pings)"]
    assert json.loads(lines[2].removeprefix("trace: ")) == {
        "stage": "rule", "rule_index": 0, "rule_id": "drop-pings", "action": {"drop": True}}
    unknown_event.refused("not_found")

    # replay over the last 4: push, ping, labeled, PR (newest first)
    replay = replay.json()
    assert replay["evaluated"] == 4
    assert replay["decisions"] == {"queue:inbox": 1, "queue:triage": 3}
    assert [c["event_id"] for c in replay["changed"]] == [sent["github_ping.json"][1],
                                                          sent["github_pull_request_opened.json"][0]]
    ping_change, pr_change = replay["changed"]
    assert ping_change["before"] == {"drop": True, "queue": None, "endpoints": [], "faulted": False}
    assert ping_change["after"] == {"drop": False, "queue": "triage", "endpoints": [owner["endpoint_id"]],
                                    "faulted": False}
    assert pr_change["before"]["queue"] == "reviews" and pr_change["after"]["queue"] == "triage"
    assert (ping_change["kind"], ping_change["title"]) == ("ping", "ping: octo-org/octo-repo")
    assert pr_change["kind"] == "pull_request" and pr_change["title"].startswith("pull_request opened: octo-org/")
    everything = everything.json()  # the default: the last 100
    assert everything["evaluated"] == 6 and everything["decisions"] == {"queue:inbox": 1, "queue:triage": 5}
    assert [c["event_id"] for c in everything["changed"]] == [  # push and labeled stay where they were
        sent["github_ping.json"][1], sent["github_pull_request_opened.json"][0], sent["github_ping.json"][0],
        sent["github_issues_opened.json"][0]]
    text = replay_text.ok().stdout
    assert "evaluated: 4" in text and "queue:triage: 3" in text and text.count("changed: ") == 2
    assert f"changed: {ping_change['event_id']} ping ping: octo-org/octo-repo\n  drop -> queue:triage\n" in text
    bad_last.refused("invalid_argument")
    # nothing was saved by any of it
    assert stack.webhooks.rules(webhook_id, caller=CLI) == {"webhook_id": webhook_id, **GITHUB_RULES}


def test_events_list_and_show(stack, owner):
    hook = stack.webhook(owner, "github", "inbox")
    stack.set_rules(hook, GITHUB_RULES)
    body = fixture("github_issues_labeled.json")
    signature = sign("github", hook["signing_secret"], body)["x-hub-signature-256"]
    first = stack.deliver(hook, fixture("github_ping.json"), event="ping").json()
    second = stack.deliver(hook, body, event="issues", headers={"authorization": "Bearer nope",
                                                                 "cookie": "sid=nope"}).json()

    listed = stack.cli.json("events", "list", "--webhook", hook["webhook_id"])
    assert list(listed) == ["events"]
    assert [e["id"] for e in listed["events"]] == [second["event_id"], first["event_id"]]  # newest first
    newest = listed["events"][0]
    assert (newest["source"], newest["kind"], newest["trust_mode"], newest["verified"]) == ("github", "issues",
                                                                                           "signed", True)
    assert (newest["disposition"], newest["todos_created"]) == ("routed", 1)
    assert newest["routing"]["rule_id"] == "label-bug"
    assert listed["events"][1]["disposition"] == "dropped" and listed["events"][1]["todos_created"] == 0
    assert "headers" not in newest and "payload" not in newest
    paged = stack.cli.json("events", "list", "--webhook", hook["webhook_id"], "--limit", "1")
    assert [e["id"] for e in paged["events"]] == [second["event_id"]]
    everyone = stack.cli.json("events", "list", "--limit", "1000")["events"]
    assert {first["event_id"], second["event_id"]} <= {e["id"] for e in everyone}

    shown = stack.cli.json("events", "show", second["event_id"])
    assert shown["id"] == second["event_id"] and EVENT_ID.match(shown["id"])
    assert shown["headers"]["x-hub-signature-256"] == REDACTED
    assert shown["headers"]["authorization"] == REDACTED and shown["headers"]["cookie"] == REDACTED
    assert shown["headers"]["x-github-event"] == "issues"
    assert shown["payload"] == json.loads(body) and shown["disposition"] == "routed"
    assert shown["todos"] == second["todos"]
    assert shown["routing"] == {"stage": "rule", "rule_index": 2, "rule_id": "label-bug", "action": {"queue": "triage"}}
    plain = stack.cli.run("events", "show", second["event_id"]).ok().stdout
    assert REDACTED in plain
    for secret in (signature, signature.removeprefix("sha256="), "nope", hook["signing_secret"]):
        assert secret not in plain and secret not in json.dumps(shown)
    stack.cli.run("events", "show", "ev_" + "0" * 32).refused("not_found")


def test_webhook_create_rotate_delete(stack, owner):
    cli = stack.cli
    created = cli.json("webhook", "create", "--endpoint", owner["slug"], "--source", "github", "--queue", "inbox")
    old_url, old_secret = created["ingest_url"], created["signing_secret"]
    assert old_url.startswith(f"{stack.server.base}/webhooks/w/") and old_secret.startswith("whsec_")
    body = fixture("github_issues_opened.json")
    assert_accepted(stack.deliver(created, body, event="issues"), trust_mode="signed", verified=True,
                    queue="inbox", created=1)

    rotated = cli.json("webhook", "rotate", created["webhook_id"])
    assert rotated["webhook_id"] == created["webhook_id"]
    new_url, new_secret = rotated["ingest_url"], rotated["signing_secret"]
    assert new_url != old_url and new_secret != old_secret and new_secret.startswith("whsec_")
    before = stack.counts()
    assert_error(stack.deliver(created, body, event="issues", url=old_url), 404, UNKNOWN_404)
    assert_error(stack.deliver(created, body, event="issues", url=old_url, secret=new_secret), 404, UNKNOWN_404)
    assert_error(stack.deliver(created, body, event="issues", url=new_url, secret=old_secret), 401, REFUSED_401)
    assert stack.counts() == before
    assert_accepted(stack.deliver(created, body, event="issues", url=new_url, secret=new_secret),
                    trust_mode="signed", verified=True, queue="inbox", created=1)

    deleted = cli.json("webhook", "delete", created["webhook_id"])
    assert deleted == {"webhook_id": created["webhook_id"], "deleted": True}
    before = stack.counts()
    assert_error(stack.deliver(created, body, event="issues", url=new_url, secret=new_secret), 404, UNKNOWN_404)
    assert stack.counts() == before
    listed, history, rotate_again, delete_again, generic, gitea = cli.run_all(
        ("webhook", "list", "--json"), ("events", "list", "--json", "--webhook", created["webhook_id"]),
        ("webhook", "rotate", created["webhook_id"]), ("webhook", "delete", created["webhook_id"]),
        ("webhook", "create", "--json", "--endpoint", owner["slug"], "--source", "generic", "--queue", "inbox"),
        ("webhook", "create", "--json", "--endpoint", owner["slug"], "--source", "gitea", "--queue", "inbox"),
    )
    assert created["webhook_id"] not in {w["webhook_id"] for w in listed.json()["webhooks"]}
    assert len(history.json()["events"]) == 2  # its deliveries stay on record
    rotate_again.refused("not_found")
    delete_again.refused("not_found")

    # a generic webhook: no secret at all, the URL is the credential
    generic = generic.json()
    assert "signing_secret" not in generic and generic["trust_mode"] == "token"
    rotated = cli.json("webhook", "rotate", generic["webhook_id"])
    assert "signing_secret" not in rotated
    assert_error(stack.post(generic["ingest_url"], b"{}"), 404, UNKNOWN_404)
    assert_accepted(stack.post(rotated["ingest_url"], b'{"title": "hello"}'), trust_mode="token", verified=False,
                    queue="inbox", created=1)
    # a gitea webhook made by the CLI: its secret keys the signature
    gitea = gitea.json()
    push = fixture("gitea_push.json")
    headers = {"x-gitea-event": "push", "x-gitea-signature": hmac_hex(gitea["signing_secret"], push)}
    assert_accepted(stack.post(gitea["ingest_url"], push, headers), trust_mode="signed", verified=True,
                    queue="inbox", created=1)
