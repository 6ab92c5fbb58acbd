"""End to end: webhook ingest against a real `switchboard serve` over real HTTP (CONTRACT §4, §5, §11).

One server (rate limit off) is shared by the module, once on SQLite and once on PostgreSQL;
setup goes through the application layer in-process on the same store and data directory.
Every refusal is checked to store nothing: the count of stored events (all of them,
deliveries and todos among them) is the same before and after.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from tests.e2e._ingest import (
    CLI, MAX_BODY, REDACTED, REFUSED_401, TOO_LARGE_413, UNKNOWN_404, Stack, assert_accepted, assert_error,
    chunked, raw_request,
)
from tests.fixtures import cairn_event, fixture, hmac_hex, sign

QUEUES = ("inbox", "reviews", "triage", "deploys", "builds")


@pytest.fixture(scope="module")
def stack(module_store_url, tmp_path_factory):
    stack = Stack(module_store_url, tmp_path_factory.mktemp("ingest")).start()
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def router(stack):
    return stack.vend("router", QUEUES, webhook_max=20)


@pytest.fixture(scope="module")
def hooks(stack, router):
    """One webhook per source type, all on the `router` endpoint, target queue `inbox`."""
    return {source: stack.webhook(router, source, "inbox") for source in ("github", "gitea", "cairn", "generic")}


def now() -> datetime:
    return datetime.now(timezone.utc)


def _cairn(**changes):
    return cairn_event(now(), **{"event_id": f"evt_{uuid.uuid4().hex}", **changes})


# -- 1. signature schemes: accepted ------------------------------------------------------------


def _github_ok(hook):
    body = fixture("github_push.json")
    return body, {"x-github-event": "push", "x-github-delivery": str(uuid.uuid4()),
                  **sign("github", hook["signing_secret"], body)}


def _gitea_ok(hook):
    body = fixture("gitea_push.json")
    return body, {"x-gitea-event": "push", "x-gitea-delivery": str(uuid.uuid4()),
                  **sign("gitea", hook["signing_secret"], body)}


def _gitea_fallback_ok(hook):
    body = fixture("gitea_push.json")  # no X-Gitea-Signature: the GitHub-compatible header
    return body, {"x-gitea-event": "push", "x-gitea-delivery": str(uuid.uuid4()),
                  **sign("github", hook["signing_secret"], body)}


def _cairn_ok(hook):
    body = _cairn()
    return body, sign("cairn", hook["signing_secret"], body)


def _cairn_with_event_id_ok(hook):
    body = _cairn()
    return body, sign("cairn", hook["signing_secret"], body, event_id=json.loads(body)["event_id"])


def _generic_ok(hook):
    return b'{"title": "disk almost full", "host": "db-1"}', {"x-delivery-id": str(uuid.uuid4())}


@pytest.mark.parametrize(("source", "make", "kind", "title"), [
    ("github", _github_ok, "push",
     "push: octo-org/octo-repo refs/heads/main (3 commits) — Release notes for 1.4.1"),
    ("gitea", _gitea_ok, "push",
     "push: infra/deploy-scripts refs/heads/main (2 commits) — Pin the rsync package version"),
    ("gitea", _gitea_fallback_ok, "push",
     "push: infra/deploy-scripts refs/heads/main (2 commits) — Pin the rsync package version"),
    ("cairn", _cairn_ok, "artifact.created", "cairn artifact.created: nightly-build-2026-01-21.tar.gz"),
    ("cairn", _cairn_with_event_id_ok, "artifact.created", "cairn artifact.created: nightly-build-2026-01-21.tar.gz"),
    ("generic", _generic_ok, None, "webhook: disk almost full"),
], ids=["github", "gitea", "gitea-x-hub-signature-256", "cairn", "cairn-with-event-id-header", "generic"])
def test_valid_delivery_is_accepted(stack, router, hooks, source, make, kind, title):
    hook = hooks[source]
    body, headers = make(hook)
    before = stack.counts()

    answer = assert_accepted(
        stack.post(hook["ingest_url"], body, {"content-type": "application/json", **headers}),
        trust_mode="token" if source == "generic" else "signed", verified=source != "generic",
        queue="inbox", created=1, endpoint_ids=[router["endpoint_id"]],
    )

    after = stack.counts()
    assert after["deliveries"] == before["deliveries"] + 1 and after["todos"] == before["todos"] + 1
    todo = stack.app.get_todo(answer["id"], caller=CLI)
    assert (todo["queue"], todo["state"], todo["source"], todo["kind"]) == ("inbox", "pending", source, kind)
    assert todo["title"] == title
    assert todo["trust_mode"] == answer["trust_mode"]
    assert todo["payload"] == json.loads(body) and todo["payload_size"] == len(body)
    assert todo["routing"] == {"stage": "default", "action": {"queue": "inbox"}}
    stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
    assert stored["disposition"] == "routed" and stored["verified"] is (source != "generic")
    assert stored["todos"] == answer["todos"] and stored["kind"] == kind and stored["size"] == len(body)
    assert stored["remote_addr"] == "127.0.0.1"
    for name in ("x-hub-signature-256", "x-gitea-signature", "x-cairn-signature"):
        if name in headers:
            assert stored["headers"][name] == REDACTED
            assert headers[name] not in json.dumps(stored)


# -- 1. signature schemes: refused -------------------------------------------------------------


def _other_secret() -> str:
    return "whsec_" + "ab" * 32


def _github(headers_of):
    def make(hook):
        body = fixture("github_issues_opened.json")
        return body, {"x-github-event": "issues", "x-github-delivery": str(uuid.uuid4()),
                      **headers_of(hook["signing_secret"], body)}
    return make


def _gitea(headers_of):
    def make(hook):
        body = fixture("gitea_issues_opened.json")
        return body, {"x-gitea-event": "issues", "x-gitea-delivery": str(uuid.uuid4()),
                      **headers_of(hook["signing_secret"], body)}
    return make


def _cairn_refused(body_of, headers_of=None):
    def make(hook):
        body = body_of()
        headers = (headers_of or (lambda s, b: sign("cairn", s, b)))(hook["signing_secret"], body)
        return body, headers
    return make


def _stale(seconds):
    def body():
        data = json.loads(_cairn())
        data["created_at"] = (now() + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
        return json.dumps(data).encode()
    return body


def _without(field):
    def body():
        data = json.loads(_cairn())
        del data[field]
        return json.dumps(data).encode()
    return body


REFUSALS = {
    "github-wrong-secret": ("github", _github(lambda s, b: sign("github", _other_secret(), b))),
    "github-missing": ("github", _github(lambda s, b: {})),
    "github-no-sha256-prefix": ("github", _github(lambda s, b: {"x-hub-signature-256": hmac_hex(s, b)})),
    "github-sha1-only": ("github", _github(lambda s, b: {"x-hub-signature": "sha1=" + "0" * 40})),
    "github-other-body": ("github", _github(lambda s, b: sign("github", s, b + b" "))),
    "github-secret-without-whsec": ("github", _github(lambda s, b: sign("github", s.removeprefix("whsec_"), b))),
    "github-truncated": ("github", _github(lambda s, b: {"x-hub-signature-256": "sha256=" + hmac_hex(s, b)[:63]})),
    "gitea-wrong-secret": ("gitea", _gitea(lambda s, b: sign("gitea", _other_secret(), b))),
    "gitea-missing": ("gitea", _gitea(lambda s, b: {})),
    "gitea-fallback-no-prefix": ("gitea", _gitea(lambda s, b: {"x-hub-signature-256": hmac_hex(s, b)})),
    "gitea-fallback-wrong": ("gitea", _gitea(lambda s, b: sign("github", _other_secret(), b))),
    # X-Gitea-Signature is present, so it is the one checked, however right the fallback is
    "gitea-wrong-beside-right-fallback": ("gitea", _gitea(
        lambda s, b: sign("github", s, b) | sign("gitea", _other_secret(), b))),
    "cairn-wrong-secret": ("cairn", _cairn_refused(_cairn, lambda s, b: sign("cairn", _other_secret(), b))),
    "cairn-missing": ("cairn", _cairn_refused(_cairn, lambda s, b: {})),
    "cairn-no-sha256-prefix": ("cairn", _cairn_refused(_cairn, lambda s, b: {"x-cairn-signature": hmac_hex(s, b)})),
    "cairn-stale": ("cairn", _cairn_refused(_stale(-360))),
    "cairn-from-the-future": ("cairn", _cairn_refused(_stale(+360))),
    "cairn-mismatched-event-id": ("cairn", _cairn_refused(
        _cairn, lambda s, b: sign("cairn", s, b, event_id="evt_somebody_else"))),
    "cairn-without-event-id": ("cairn", _cairn_refused(_without("event_id"))),
    "cairn-empty-event-id": ("cairn", _cairn_refused(lambda: _cairn(event_id="  "))),
    "cairn-without-created-at": ("cairn", _cairn_refused(_without("created_at"))),
    "cairn-created-at-not-rfc3339": ("cairn", _cairn_refused(lambda: _cairn(created_at="yesterday"))),
    "cairn-not-json": ("cairn", _cairn_refused(lambda: b"event_id=1")),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_signature_is_refused_and_stores_nothing(stack, hooks, case):
    source, make = REFUSALS[case]
    body, headers = make(hooks[source])
    before = stack.counts()

    response = stack.post(hooks[source]["ingest_url"], body, {"content-type": "application/json", **headers})

    assert_error(response, 401, REFUSED_401)
    assert stack.counts() == before


def test_unknown_token_is_404_and_stores_nothing(stack, router, hooks):
    hook = hooks["github"]
    body = fixture("github_issues_opened.json")
    signed = {"x-github-event": "issues", **sign("github", hook["signing_secret"], body)}
    base = f"{stack.server.base}/webhooks/w/"
    revoked = stack.vend("short-lived", ["inbox"])
    gone = stack.webhook(revoked, "generic", "inbox")
    stack.app.revoke(revoked["slug"], caller=CLI)
    before = stack.counts()

    for url in (base + uuid.uuid4().hex, base + "abc", base + hook["ingest_url"][-32:].upper(),
                hook["ingest_url"] + "0", gone["ingest_url"]):
        assert_error(stack.post(url, body, signed), 404, UNKNOWN_404)
    assert stack.counts() == before


# -- 1. size ------------------------------------------------------------------------------------


def _head(path: str, *lines: str) -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
                        *lines, "", ""]).encode()


def test_oversized_bodies_are_413_and_store_nothing(stack, hooks):
    port = stack.server.port
    path = hooks["generic"]["ingest_url"].removeprefix(stack.server.base)
    unknown = f"/webhooks/w/{uuid.uuid4().hex}"
    before = stack.counts()

    # a declared length over 5 MiB is refused before a byte of the body is read
    started = time.monotonic()
    status, headers, body = raw_request(port, _head(path, f"Content-Length: {MAX_BODY + 1}"))
    assert (status, json.loads(body)) == (413, TOO_LARGE_413)
    assert time.monotonic() - started < 2
    # ... and before the token is looked at
    status, _, body = raw_request(port, _head(unknown, f"Content-Length: {MAX_BODY + 1}"))
    assert (status, json.loads(body)) == (413, TOO_LARGE_413)
    # no Content-Length at all (chunked): the running count stops it
    status, _, body = raw_request(port, _head(path, "Transfer-Encoding: chunked"), chunked(MAX_BODY + 1))
    assert (status, json.loads(body)) == (413, TOO_LARGE_413)
    # a well-behaved client sending the whole body
    assert_error(stack.post(hooks["generic"]["ingest_url"], b" " * (MAX_BODY + 1)), 413, TOO_LARGE_413)
    # a signed source with a valid signature over the oversized body: size comes first
    big = b'{"pad": "' + b"x" * MAX_BODY + b'"}'
    assert_error(stack.deliver(hooks["github"], big, event="push"), 413, TOO_LARGE_413)
    assert stack.counts() == before

    # exactly 5 MiB is accepted, with or without Content-Length
    head = b'{"title": "big", "pad": "'
    exact = head + b"x" * (MAX_BODY - len(head) - 2) + b'"}'
    assert len(exact) == MAX_BODY
    assert_accepted(stack.post(hooks["generic"]["ingest_url"], exact), trust_mode="token", verified=False,
                    queue="inbox", created=1)
    status, _, body = raw_request(port, _head(path, "Transfer-Encoding: chunked"), chunked(MAX_BODY))
    assert status == 202, body  # 5 MiB of spaces: not JSON, kept as text
    assert stack.counts()["deliveries"] == before["deliveries"] + 2


# -- 1. rate limit ------------------------------------------------------------------------------


def test_rate_limit_is_429_with_retry_after_and_stores_nothing(stack, hooks, tmp_path):
    """A second server on the same store with SWITCHBOARD_INGEST_RATE=1, BURST=2."""
    if stack.url.startswith("postgresql"):
        pytest.skip("the rate limit is per process and the same on every store: checked on SQLite")
    limited = stack.another_server("limited", SWITCHBOARD_INGEST_RATE="1", SWITCHBOARD_INGEST_BURST="2")
    try:
        url = hooks["generic"]["ingest_url"].replace(stack.server.base, limited.base)
        signed_url = hooks["github"]["ingest_url"].replace(stack.server.base, limited.base)
        before = stack.counts()
        first = stack.post(url, b'{"title": "one"}')
        second = stack.post(url, b'{"title": "two"}')
        assert (first.status_code, second.status_code) == (202, 202)
        middle = stack.counts()
        assert middle["deliveries"] == before["deliveries"] + 2

        refused = [
            stack.post(url, b'{"title": "three"}'),
            stack.deliver(hooks["github"], fixture("github_ping.json"), url=signed_url),  # valid signature
            stack.post(f"{limited.base}/webhooks/w/{uuid.uuid4().hex}", b"{}"),  # before the token check
            stack.post(url, b" " * (MAX_BODY + 1)),  # before the size check
        ]
        for response in refused:
            assert_error(response, 429, {"error": "rate limit exceeded", "code": "rate_limited"})
            assert response.headers["retry-after"].isdigit() and int(response.headers["retry-after"]) >= 1
        assert stack.counts() == middle

        time.sleep(int(refused[0].headers["retry-after"]) + 0.05)
        assert stack.post(url, b'{"title": "four"}').status_code == 202
        # the shared server (rate 0) never limits
        for _ in range(5):
            assert stack.post(hooks["generic"]["ingest_url"], b'{"title": "unlimited"}').status_code == 202
    finally:
        assert limited.stop() == 0, limited.output()
    assert "Traceback" not in limited.stderr(), limited.output()


# -- 2. real-shaped payloads routed by rules ----------------------------------------------------


GITHUB_RULES = {
    "rules": [
        {"id": "drop-pings", "name": "drop pings", "expr": '.kind == "ping"', "action": {"drop": True}},
        {"id": "prs-opened", "name": "PRs opened → reviews",
         "expr": '.kind == "pull_request" and .payload.action == "opened"', "action": {"queue": "reviews"}},
        {"id": "label-bug", "name": "label bug → triage",
         "expr": '.kind == "issues" and .payload.action == "labeled" and .payload.label.name == $params.bug',
         "action": {"queue": "triage"}},
    ],
    "params": {"bug": "bug"},
}


def _github_headers(event: str, delivery: str) -> dict[str, str]:
    return {"x-github-event": event, "x-github-delivery": delivery, "x-github-hook-id": "4242",
            "x-github-hook-installation-target-type": "repository", "user-agent": "GitHub-Hookshot/044aadd",
            "x-hub-signature": "sha1=" + "1" * 40, "authorization": "Bearer do-not-store",
            "cookie": "session=do-not-store"}


@pytest.mark.parametrize(("name", "event", "queue", "stage", "rule", "title"), [
    ("github_issues_opened.json", "issues", "inbox", "default", None,
     "issues opened: octo-org/octo-repo#12 Uploader crashes when the artifact name contains a space"),
    ("github_issues_labeled.json", "issues", "triage", "rule", 2,
     "issues labeled: octo-org/octo-repo#12 Uploader crashes when the artifact name contains a space"),
    ("github_pull_request_opened.json", "pull_request", "reviews", "rule", 1,
     "pull_request opened: octo-org/octo-repo#7 Retry uploads with exponential backoff"),
    ("github_push.json", "push", "inbox", "default", None,
     "push: octo-org/octo-repo refs/heads/main (3 commits) — Release notes for 1.4.1"),
    ("github_ping.json", "ping", None, "rule", 0, None),
], ids=["issues-opened", "issues-labeled-bug", "pull-request-opened", "push", "ping"])
def test_github_deliveries_routed_by_rules(stack, router, name, event, queue, stage, rule, title, github_routed):
    hook = github_routed
    body = fixture(name)
    delivery = str(uuid.uuid4())
    before = stack.counts()

    response = stack.deliver(hook, body, event=event, delivery=delivery, headers=_github_headers(event, delivery))

    trace = ({"stage": "default", "action": {"queue": "inbox"}} if stage == "default" else
             {"stage": "rule", "rule_index": rule, "rule_id": GITHUB_RULES["rules"][rule]["id"],
              "action": GITHUB_RULES["rules"][rule]["action"]})
    after = stack.counts()
    assert after["deliveries"] == before["deliveries"] + 1
    if queue is None:  # dropped: stored, no todo
        answer = assert_accepted(response, trust_mode="signed", verified=True, queue=None, created=0)
        assert answer["dropped"] is True and answer["todos"] == []
        assert after["todos"] == before["todos"]
    else:
        answer = assert_accepted(response, trust_mode="signed", verified=True, queue=queue, created=1,
                                 endpoint_ids=[router["endpoint_id"]])
        assert "dropped" not in answer and "faulted" not in answer
        assert after["todos"] == before["todos"] + 1
        todo = stack.app.get_todo(answer["id"], caller=CLI)
        assert (todo["queue"], todo["title"], todo["trust_mode"], todo["kind"]) == (queue, title, "signed", event)
        assert todo["routing"] == trace
        assert len(todo["title"]) <= 200
    stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
    assert stored["disposition"] == ("dropped" if queue is None else "routed")
    assert stored["routing"] == trace
    assert stored["kind"] == event and stored["payload"] == json.loads(body)
    for secret_header in ("x-hub-signature-256", "x-hub-signature", "authorization", "cookie"):
        assert stored["headers"][secret_header] == REDACTED
    assert "do-not-store" not in json.dumps(stored)
    assert stored["headers"]["x-github-delivery"] == delivery and stored["headers"]["x-github-hook-id"] == "4242"
    summary = [e for e in stack.events_of(hook) if e["id"] == answer["event_id"]]
    assert summary and summary[0]["disposition"] == stored["disposition"] and summary[0]["routing"] == trace


@pytest.fixture(scope="module")
def github_routed(stack, router):
    hook = stack.webhook(router, "github", "inbox")
    stack.set_rules(hook, GITHUB_RULES)
    return hook


def test_gitea_and_cairn_deliveries_routed_by_rules(stack, router):
    gitea = stack.webhook(router, "gitea", "inbox")
    stack.set_rules(gitea, {
        "rules": [
            {"id": "main-pushes", "expr": '.kind == "push" and .payload.ref == "refs/heads/main"',
             "action": {"queue": "deploys"}},
            {"id": "prs", "expr": '.headers["x-gitea-event"] == "pull_request"', "action": {"queue": "reviews"}},
        ],
        "default_action": {"queue": "triage"},
    })
    cairn = stack.webhook(router, "cairn", "inbox")
    stack.set_rules(cairn, {"rules": [
        {"id": "tarballs", "expr": '.kind == $params.kind and (.payload.artifact.name | endswith(".tar.gz"))',
         "action": {"queue": "builds"}},
    ], "params": {"kind": "artifact.created"}})

    cases = [
        ("gitea_issues_opened.json", "issues", "triage", {"stage": "default", "action": {"queue": "triage"}},
         "issues opened: infra/deploy-scripts#3 Nightly backup role fails on hosts without rsync"),
        ("gitea_pull_request_opened.json", "pull_request", "reviews",
         {"stage": "rule", "rule_index": 1, "rule_id": "prs", "action": {"queue": "reviews"}},
         "pull_request opened: infra/deploy-scripts#4 Install rsync before running the backup role"),
        ("gitea_push.json", "push", "deploys",
         {"stage": "rule", "rule_index": 0, "rule_id": "main-pushes", "action": {"queue": "deploys"}},
         "push: infra/deploy-scripts refs/heads/main (2 commits) — Pin the rsync package version"),
    ]
    for name, event, queue, trace, title in cases:
        body = fixture(name)
        delivery = str(uuid.uuid4())
        # what Gitea sends: its own headers plus the GitHub- and Gogs-compatible copies
        headers = {"x-gitea-event": event, "x-gitea-event-type": event, "x-gitea-delivery": delivery,
                   "x-github-event": event, "x-github-delivery": delivery, "x-gogs-event": event,
                   "x-gogs-delivery": delivery, "x-gogs-signature": hmac_hex(gitea["signing_secret"], body),
                   **sign("github", gitea["signing_secret"], body)}
        answer = assert_accepted(stack.deliver(gitea, body, event=event, delivery=delivery, headers=headers),
                                 trust_mode="signed", verified=True, queue=queue, created=1)
        todo = stack.app.get_todo(answer["id"], caller=CLI)
        assert (todo["title"], todo["routing"], todo["kind"], todo["source"]) == (title, trace, event, "gitea")
        stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
        assert stored["routing"] == trace
        for name_ in ("x-gitea-signature", "x-hub-signature-256", "x-gogs-signature"):
            assert stored["headers"][name_] == REDACTED

    body = _cairn()
    event_id = json.loads(body)["event_id"]
    answer = assert_accepted(
        stack.post(cairn["ingest_url"], body, {"content-type": "application/json",
                                               **sign("cairn", cairn["signing_secret"], body, event_id=event_id)}),
        trust_mode="signed", verified=True, queue="builds", created=1)
    todo = stack.app.get_todo(answer["id"], caller=CLI)
    assert todo["title"] == "cairn artifact.created: nightly-build-2026-01-21.tar.gz"
    assert todo["routing"] == {"stage": "rule", "rule_index": 0, "rule_id": "tarballs", "action": {"queue": "builds"}}
    stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
    assert stored["kind"] == "artifact.created" and stored["headers"]["x-cairn-signature"] == REDACTED
    assert stored["headers"]["x-cairn-event-id"] == event_id
    # the cairn event id is the delivery id: the same event again is the same todo
    again = stack.post(cairn["ingest_url"], body, {"content-type": "application/json",
                                                   **sign("cairn", cairn["signing_secret"], body)})
    assert assert_accepted(again, trust_mode="signed", verified=True, queue="builds", created=0)["id"] == answer["id"]


def test_repeat_delivery_returns_the_live_todo_and_is_stored(stack, router, github_routed):
    body = fixture("github_issues_opened.json")
    delivery = str(uuid.uuid4())
    first = assert_accepted(stack.deliver(github_routed, body, event="issues", delivery=delivery),
                            trust_mode="signed", verified=True, queue="inbox", created=1)
    before = stack.counts()
    again = assert_accepted(stack.deliver(github_routed, body, event="issues", delivery=delivery),
                            trust_mode="signed", verified=True, queue="inbox", created=0)
    assert again["id"] == first["id"] and again["todos"][0]["created"] is False
    assert again["event_id"] != first["event_id"]
    after = stack.counts()
    assert (after["deliveries"], after["todos"]) == (before["deliveries"] + 1, before["todos"])
    # a different delivery id with the same body is a new todo
    other = stack.deliver(github_routed, body, event="issues", delivery=str(uuid.uuid4()))
    assert assert_accepted(other, trust_mode="signed", verified=True, queue="inbox", created=1)["id"] != first["id"]


def test_form_encoded_github_delivery(stack, router, github_routed):
    """GitHub's `application/x-www-form-urlencoded` mode: the JSON is in the `payload` field."""
    from urllib.parse import urlencode

    payload = fixture("github_pull_request_opened.json")
    body = urlencode({"payload": payload.decode()}).encode()
    response = stack.deliver(github_routed, body, event="pull_request",
                             headers={"content-type": "application/x-www-form-urlencoded"})
    answer = assert_accepted(response, trust_mode="signed", verified=True, queue="reviews", created=1)
    todo = stack.app.get_todo(answer["id"], caller=CLI)
    assert todo["payload"] == json.loads(payload)
    assert todo["title"].startswith("pull_request opened: octo-org/octo-repo#7 ")


def test_other_methods_and_paths_answer_json_errors_and_store_nothing(stack, hooks):
    """Every error body is `{"error", "code"}` (CONTRACT §3), the router's own 404/405 too."""
    before = stack.counts()
    for method in ("GET", "PUT", "DELETE"):
        response = stack.http.request(method, hooks["generic"]["ingest_url"])
        assert_error(response, 405, {"error": "Method Not Allowed", "code": "method_not_allowed"})
        assert "POST" in response.headers["allow"]
    for path in ("/webhooks/w/", "/webhooks/w/" + "0" * 32 + "/more", "/webhooks/nope/deeper/still"):
        assert_error(stack.post(stack.server.base + path, b"{}"), 404, {"error": "Not Found", "code": "not_found"})
    assert stack.counts() == before


def test_bodies_that_are_not_storable_text_are_kept_as_raw_text(stack, router, hooks):
    """JSON that parses but is not Unicode text (a lone surrogate) is no payload: the delivery is
    accepted and kept as raw text (the event codec could not write it). A NUL inside the payload
    is fine; a NUL in a cairn `kind` makes it no kind, and in a cairn `event_id` a refusal: a
    PostgreSQL text column cannot hold NUL, and the read models must not stop at such a delivery."""
    generic = hooks["generic"]["ingest_url"]
    bodies = [
        b'{"title": "lone \\ud800 surrogate"}',
        b'{"title": "raw \xed\xa0\x80 surrogate"}',
        '{"title": "utf-16 \ud800"}'.encode("utf-16", "surrogatepass"),
    ]
    for body in bodies:
        answer = assert_accepted(stack.post(generic, body, {"content-type": "application/json"}),
                                 trust_mode="token", verified=False, queue="inbox", created=1)
        todo = stack.app.get_todo(answer["id"], caller=CLI)
        assert isinstance(todo["payload"], str)
        assert todo["title"].startswith(f"webhook: not JSON, {len(body)} bytes (application/json)")
        stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
        assert stored["payload"] is None and stored["size"] == len(body)
    # an escaped surrogate pair is ordinary text
    pair = assert_accepted(stack.post(generic, b'{"title": "smile \\ud83d\\ude00"}'), trust_mode="token",
                           verified=False, queue="inbox", created=1)
    assert stack.app.get_todo(pair["id"], caller=CLI)["title"] == "webhook: smile \U0001F600"
    nul = assert_accepted(stack.post(generic, b'{"title": "a\\u0000b", "data": "\\u0000"}'), trust_mode="token",
                          verified=False, queue="inbox", created=1)
    assert stack.app.get_todo(nul["id"], caller=CLI)["payload"] == {"title": "a\x00b", "data": "\x00"}

    cairn = hooks["cairn"]
    body = _cairn(kind="artifact\u0000created")
    answer = assert_accepted(stack.post(cairn["ingest_url"], body, sign("cairn", cairn["signing_secret"], body)),
                             trust_mode="signed", verified=True, queue="inbox", created=1)
    assert stack.webhooks.get_event(answer["event_id"], caller=CLI)["kind"] is None
    before = stack.counts()
    body = _cairn(event_id="evt\u0000nul")
    assert_error(stack.post(cairn["ingest_url"], body, sign("cairn", cairn["signing_secret"], body)), 401,
                 REFUSED_401)
    assert stack.counts() == before
    # the read models keep up with everything above
    listed = {e["id"] for e in stack.events_of(cairn)} | {e["id"] for e in stack.events_of(hooks["generic"])}
    assert {answer["event_id"], nul["event_id"], pair["event_id"]} <= listed
    deadline = time.monotonic() + 5
    while "projections tick failed" not in stack.server.stderr() and time.monotonic() < deadline:
        if stack.scalar("SELECT count(*) FROM sb_stored_deliveries WHERE event_id = %s", (answer["event_id"],)):
            break
        time.sleep(0.05)
    assert "projections tick failed" not in stack.server.stderr(), stack.server.output()
