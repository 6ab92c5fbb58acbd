"""End to end: a rules dry run on a delivery whose body retention pruned (CONTRACT §5, §14) is a
conflict that says so on every surface — the CLI, the API and the board's dry-run form — while a
delivery the caller may not see stays not found."""

from __future__ import annotations

import json
import re
import time
import uuid

import httpx

from tests.e2e._support import Cli, Server
from tests.e2e.test_board_http import Browser, alerts

PRUNED = re.compile(r"event (ev_[0-9a-f]{32}) has no body to dry-run: "
                    r"payload pruned at \S+Z \(sha256 [0-9a-f]{64}, \d+ bytes\)")
DROP_ALL = {"rules": [{"id": "all", "expr": "true", "action": {"drop": True}}]}


def test_a_dry_run_on_a_pruned_delivery_is_a_conflict_on_the_cli_the_api_and_the_board(tmp_path):
    url = f"sqlite:///{tmp_path}/switchboard.db"
    server = Server(tmp_path, tmp_path, url=url, SWITCHBOARD_INGEST_RATE="0").start()
    try:
        server.wait_healthy()
        cli = Cli(url, tmp_path)
        slug = cli.json("endpoint", "vend", "pruned-agent", "--queue", "inbox")["slug"]
        hook = cli.json("webhook", "create", "--endpoint", slug, "--source", "generic", "--queue", "inbox")
        (tmp_path / "rules.json").write_text(json.dumps(DROP_ALL))
        cli.run("rules", "set", hook["webhook_id"], "--file", str(tmp_path / "rules.json")).ok()
        sent = httpx.post(hook["ingest_url"], json={"kind": "ping"}, headers={"x-delivery-id": str(uuid.uuid4())})
        assert sent.status_code == 202 and sent.json().get("dropped"), sent.text
        event_id = sent.json()["event_id"]
        time.sleep(1.1)
        assert cli.json("retention", "prune", "--older-than", "1s")["deliveries"] == 1
        note = cli.json("events", "show", event_id)["payload_pruned"]["text"]
        expected = f"event {event_id} has no body to dry-run: {note}"

        message = cli.run("rules", "test", hook["webhook_id"], "--event", event_id).refused("conflict")
        assert message == expected and PRUNED.fullmatch(message), message
        unknown = f"ev_{uuid.uuid4().hex}"
        assert cli.run("rules", "test", hook["webhook_id"], "--event", unknown).refused("not_found") == (
            f"event {unknown} not found")

        token = cli.json("operator", "token", "admin")["token"]
        api = f"{server.base}/api/v1/webhooks/{hook['webhook_id']}/rules/test"
        answer = httpx.post(api, json={"event_id": event_id}, headers={"authorization": f"Bearer {token}"})
        assert (answer.status_code, answer.json()) == (409, {"error": expected, "code": "conflict"})

        board = Browser(server.base)
        try:
            board.sign_in("admin", (tmp_path / "admin-password").read_text().strip())
            tried = board.post(f"/webhooks/{hook['webhook_id']}/rules/test", rules=json.dumps(DROP_ALL),
                               event_id=event_id)
            assert tried.status_code == 409 and '<textarea id="rules-text"' in tried.text  # the form, not an error page
            assert expected in alerts(tried.text)[0]
        finally:
            board.close()
    finally:
        assert server.stop() == 0, server.output()
