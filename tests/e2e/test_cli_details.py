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

    # what `rules get` prints reads back as a rules file and as a candidate
    (tmp_path / "got.json").write_text(cli.run("rules", "get", wid, "--json").ok().stdout)
    assert cli.json("rules", "set", wid, "--file", "got.json") == {"webhook_id": wid, **rules}

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
