"""The MCP adapter's tables: verbs ↔ domain verbs, input schemas, and errors → tool error codes."""

from __future__ import annotations

import logging

import msgspec
import pytest

from application.errors import CommitOutcomeUnknown, RetryLimitExceeded, StoreUnavailable
from domain.endpoint import ALL_VERBS
from domain.errors import CeilingExceeded, Conflict, Forbidden, ForbiddenSourceType, InvalidArgument, NotFound
from domain.signatures import SignatureRefused
from domain.rule_set import RuleError
from interfaces.mcp.errors import INTERNAL_MESSAGE, tool_error
from interfaces.mcp.wire import transport_security
from interfaces.mcp.tools import INPUT_SCHEMAS, VERBS, ListTodos, parse_arguments


def test_every_domain_verb_has_exactly_one_tool_in_the_same_order():
    assert tuple(VERBS) == ALL_VERBS
    assert tuple(INPUT_SCHEMAS) == ALL_VERBS


@pytest.mark.parametrize("verb", ALL_VERBS)
def test_each_input_schema_is_a_closed_object(verb):
    schema = INPUT_SCHEMAS[verb]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    assert "$ref" not in str(schema) and "title" not in schema


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (InvalidArgument("bad"), "invalid_argument", "bad"),
        (NotFound("todo td_x not found"), "not_found", "todo td_x not found"),
        (Conflict("held"), "conflict", "held"),
        (Forbidden("no"), "forbidden", "no"),
        (CeilingExceeded("full"), "ceiling_exceeded", "full"),
        (ForbiddenSourceType("github"), "forbidden_source_type", "github"),
        (RetryLimitExceeded("busy"), "conflict", "busy"),
        (RuleError("too_many_rules", "33"), "too_many_rules", "33"),
        (RuleError("invalid_rule", "r"), "invalid_rule", "r"),
        (RuleError("invalid_expression", "e"), "invalid_expression", "e"),
        (RuleError("forbidden_function", "f"), "forbidden_function", "f"),
        (RuleError("invalid_params", "p"), "invalid_params", "p"),
        (RuleError("forbidden", "q"), "forbidden", "q"),
        (msgspec.ValidationError("Object missing required field `id`"), "invalid_argument",
         "Object missing required field `id`"),
        (StoreUnavailable("connection refused"), "unavailable", "store down"),  # nothing was done (CONTRACT §12)
        (CommitOutcomeUnknown("store down: whether this was stored is unknown (retrying it is safe)"), "internal",
         "store down: whether this was stored is unknown (retrying it is safe)"),
        (SignatureRefused("bad digest"), "internal", INTERNAL_MESSAGE),  # no tool can raise it: never leaked
        (KeyError("boom"), "internal", INTERNAL_MESSAGE),
    ],
)
def test_each_error_has_its_tool_error_code(error, code, message):
    assert tool_error(error, verb="get_todo") == (code, message)


def test_an_unexpected_error_is_logged_with_its_traceback_but_not_told(caplog):
    with caplog.at_level(logging.ERROR, logger="switchboard.mcp"):
        assert tool_error(ZeroDivisionError("secret detail"), verb="claim") == ("internal", INTERNAL_MESSAGE)
    [record] = caplog.records
    assert record.exc_info is not None and "claim" in record.getMessage()


def test_arguments_are_parsed_strictly():
    verb = VERBS["list_todos"]
    assert parse_arguments(verb, None) == ListTodos()
    assert parse_arguments(verb, {"queue": "q", "limit": 5}) == ListTodos(queue="q", limit=5)
    for bad in ({"limit": "5"}, {"limit": True}, {"extra": 1}, {"queue": 3}):
        with pytest.raises(msgspec.ValidationError):
            parse_arguments(verb, bad)


def test_allowed_hosts_are_the_base_url_host_and_loopback():
    settings = transport_security("https://switchboard.example.com")
    assert settings.enable_dns_rebinding_protection
    for host in ("switchboard.example.com", "switchboard.example.com:443", "127.0.0.1:8080", "localhost", "[::1]:1"):
        assert host in settings.allowed_hosts or f"{host.rsplit(':', 1)[0]}:*" in settings.allowed_hosts, host
    assert not any("evil" in h for h in settings.allowed_hosts)
    assert "https://switchboard.example.com" in settings.allowed_origins
    assert "http://localhost:*" in settings.allowed_origins
