"""Text no store can hold is refused at the door or neutralised in read models, never fatal."""

from __future__ import annotations

import pytest

from domain.errors import InvalidArgument
from tests.contract.harness import CLI, unique


def test_a_lone_surrogate_in_a_push_is_refused_as_invalid(sb):
    endpoint = sb.app.vend(unique("agent"), queues=["work"], caller=CLI)
    with pytest.raises(InvalidArgument):
        sb.app.push(endpoint["slug"], "title \ud800", caller=CLI)
    with pytest.raises(InvalidArgument):
        sb.app.push(endpoint["slug"], "fine", caller=CLI, payload={"x": "\udfff"})


def test_a_nul_in_text_does_not_stop_the_read_models(sb):
    endpoint = sb.app.vend(unique("agent"), queues=["work"], caller=CLI)
    pushed = sb.app.push(endpoint["slug"], "before\x00after", caller=CLI, payload={"k": "v\x00"})
    after = sb.app.push(endpoint["slug"], "a later todo", caller=CLI)

    rows = sb.app.list_todos(caller=CLI, endpoint=endpoint["slug"])

    assert {r["id"] for r in rows} == {pushed["todo"]["id"], after["todo"]["id"]}
    assert sb.container.projector.verify() == []
