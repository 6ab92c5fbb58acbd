"""Endpoints (CONTRACT §2 vend, §7): defaults, credential, slug, mcp_json, authentication, revoke."""

from __future__ import annotations

import re

import pytest

from domain.errors import Conflict, Forbidden, NotFound

from .harness import CLI, agent, unique

CONTRACT_VERBS = {
    "list_todos", "get_todo", "claim", "claim_next", "heartbeat", "complete", "fail", "release",
    "create_webhook", "list_webhooks", "rotate_webhook", "delete_webhook", "add_webhook_route",
    "remove_webhook_route", "list_webhook_routes", "list_webhook_rules", "set_webhook_rules",
    "test_webhook_rules", "list_webhook_events", "get_webhook_event", "get_default_lease",
    "set_default_lease",
}


def listed(sb, vended, caller=CLI):
    (entry,) = [e for e in sb.app.list_endpoints(caller=caller) if e["slug"] == vended["slug"]]
    return entry


def test_vend_defaults_to_every_verb_five_webhooks_and_the_given_queues(sb):
    queues = [unique("builds"), unique("deploys")]
    vended = sb.vend("worker", queues=queues)

    assert set(vended["verbs"]) == CONTRACT_VERBS and len(vended["verbs"]) == len(CONTRACT_VERBS)
    assert vended["queues"] == queues
    assert vended["expires_at"] is None
    entry = listed(sb, vended)
    assert entry["endpoint_id"] == vended["endpoint_id"]
    assert entry["webhook_max"] == 5
    assert entry["queues"] == queues
    assert entry["webhook_queues"] == queues
    assert entry["source_types"] == ["github", "gitea", "cairn", "generic"]
    assert set(entry["verbs"]) == CONTRACT_VERBS
    assert entry["owner"] == "admin"
    assert entry["revoked"] is False
    assert entry["default_lease_ttl_seconds"] is None


def test_vend_keeps_the_scope_it_is_given(sb):
    queue, hooks = unique("builds"), unique("hooks")
    vended = sb.vend(
        "narrow", queues=[queue], verbs=["claim_next", "complete"], webhook_max=2,
        source_types=["github"], webhook_queues=[hooks], default_lease_seconds=120, ttl_seconds=3600,
    )

    assert vended["verbs"] == ["claim_next", "complete"]
    assert vended["expires_at"] == "2026-01-01T01:00:00Z"
    entry = listed(sb, vended)
    assert (entry["webhook_max"], entry["source_types"], entry["webhook_queues"]) == (2, ["github"], [hooks])
    assert entry["default_lease_ttl_seconds"] == 120


def test_credential_is_sbk_and_43_base64url_chars(sb):
    first, second = sb.vend("worker"), sb.vend("worker")

    for vended in (first, second):
        assert re.fullmatch(r"sbk_[A-Za-z0-9_-]{43}", vended["credential"]), vended["credential"]
    assert first["credential"] != second["credential"]


def test_mcp_json_names_the_mcp_url_and_the_bearer_credential(sb):
    vended = sb.vend("worker")

    assert vended["mcp_url"] == f"http://127.0.0.1:8080/mcp/{vended['slug']}"
    assert vended["mcp_json"] == {"mcpServers": {"switchboard": {
        "type": "http", "url": vended["mcp_url"],
        "headers": {"Authorization": f"Bearer {vended['credential']}"},
    }}}


def test_slug_is_the_slugified_agent_name_a_dash_and_four_random_chars(sb):
    tag = unique("x")
    vended = sb.app.vend(f"Build Bot {tag.upper()} Ünïcode!", queues=[unique("q")], caller=CLI)

    assert re.fullmatch(rf"build-bot-{tag}-unicode-[a-z0-9]{{4}}", vended["slug"]), vended["slug"]


def test_the_credential_authenticates_its_endpoint_until_revoked(sb):
    vended = sb.vend("worker")

    endpoint = sb.app.authenticate_endpoint(vended["credential"])
    assert endpoint is not None and endpoint.slug == vended["slug"]
    assert sb.app.authenticate_endpoint(vended["credential"] + "x") is None
    assert sb.app.authenticate_endpoint("sbk_" + "A" * 43) is None

    sb.app.revoke(vended["slug"], caller=CLI)

    assert sb.app.authenticate_endpoint(vended["credential"]) is None
    assert listed(sb, vended)["revoked"] is True
    with pytest.raises(Forbidden):
        sb.app.claim_next(caller=agent(vended))


def test_an_expired_endpoint_is_treated_as_revoked(sb):
    vended = sb.vend("worker", ttl_seconds=60)
    assert sb.app.authenticate_endpoint(vended["credential"]) is not None

    sb.tick(60)

    assert sb.app.authenticate_endpoint(vended["credential"]) is None
    with pytest.raises(Forbidden):
        sb.app.claim_next(caller=agent(vended))


def test_revoke_names_the_endpoint_by_slug_or_id(sb):
    by_slug, by_id = sb.vend("worker"), sb.vend("worker")

    assert sb.app.revoke(by_slug["slug"], caller=CLI)["revoked"] is True
    assert sb.app.revoke(by_id["endpoint_id"], caller=CLI)["revoked"] is True
    with pytest.raises(NotFound):
        sb.app.revoke(unique("nobody"), caller=CLI)


def test_revoking_a_revoked_endpoint_is_a_conflict(sb):
    vended = sb.vend("worker")
    sb.app.revoke(vended["slug"], caller=CLI)

    with pytest.raises(Conflict):
        sb.app.revoke(vended["slug"], caller=CLI)


def test_revoke_releases_the_leases_the_endpoint_holds(sb):
    vended = sb.vend("worker")
    held = sb.push(vended, "held")
    sb.tick()
    untouched = sb.push(vended, "untouched")
    claimed = sb.app.claim_next(caller=agent(vended))["todo"]
    assert claimed["id"] == held["id"]
    sb.tick(5)

    answer = sb.app.revoke(vended["slug"], caller=CLI)

    assert answer["released_leases"] == 1
    todo = sb.todo(held["id"])
    assert (todo["state"], todo["owner"], todo["lease_expires_at"]) == ("pending", None, None)
    assert todo["attempt"] == 1
    (prior,) = todo["prior_attempts"]
    assert (prior["seq"], prior["outcome"], prior["ended_at"]) == (1, "revoked", "2026-01-01T00:00:06Z")
    assert sb.todo(untouched["id"])["state"] == "pending"
    (released,) = [e for e in sb.app.history(held["id"], caller=CLI)["events"] if e["type"] == "TodoReleased"]
    assert (released["actor"], released["cause"]) == ("operator:cli", "endpoint_revoked")
