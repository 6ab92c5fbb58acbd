"""Queue resource URIs (interfaces/mcp/resources.py, ADR 41): which URIs name a queue of the
endpoint's scope, and the one refusal (-32602 with data.uri) for every other."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mcp.shared.exceptions import MCPError

from interfaces.mcp.resources import MALFORMED, UNKNOWN, list_queues, queue_of, queue_uri

ENDPOINT = SimpleNamespace(queues=["work", "re.views_2-x"])


def test_a_queue_of_the_scope_is_its_resource():
    assert queue_uri("work") == "switchboard://queues/work"
    assert queue_of("switchboard://queues/work", ENDPOINT) == "work"
    assert queue_of("switchboard://queues/re.views_2-x", ENDPOINT) == "re.views_2-x"
    assert [(r.uri, r.name, r.mime_type) for r in list_queues(ENDPOINT).resources] == [
        ("switchboard://queues/work", "work", "application/json"),
        ("switchboard://queues/re.views_2-x", "re.views_2-x", "application/json")]


@pytest.mark.parametrize(("uri", "message"), [
    ("switchboard://queues/elsewhere", UNKNOWN),  # another endpoint's queue reads like no queue at all
    ("switchboard://queues/quarantine", UNKNOWN),
    ("switchboard://queues/", MALFORMED),
    ("switchboard://queues/Work", MALFORMED),
    ("switchboard://queues/work/x", MALFORMED),
    ("switchboard://queues/" + "a" * 65, MALFORMED),
    ("switchboard://todos/work", MALFORMED),
    ("https://example.com/work", MALFORMED),
    ("", MALFORMED),
    (None, MALFORMED),
])
def test_every_other_uri_is_invalid_params_naming_it(uri, message):
    with pytest.raises(MCPError) as refused:
        queue_of(uri, ENDPOINT)
    assert (refused.value.error.code, refused.value.error.message, refused.value.error.data) == (
        -32602, message, {"uri": uri})
