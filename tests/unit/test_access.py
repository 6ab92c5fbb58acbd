"""The one access policy (application/access.py), on domain objects: who may touch what."""

from __future__ import annotations

from datetime import datetime, timezone
from uuid import UUID

import pytest

from application.access import Caller, in_scope, may_touch, scope_of, vend_owner, visible_owner
from domain.endpoint import Endpoint, credential_hash, endpoint_uuid
from domain.errors import Forbidden
from domain.names import QUARANTINE
from domain.todo import Todo

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def endpoint(slug: str, owner: str) -> Endpoint:
    return Endpoint.vend(id=endpoint_uuid(slug), now=T0, actor="operator:cli", slug=slug, agent="a",
                         owner=owner, credential_sha256=credential_hash("sbk_x"), queues=["work"])


def todo_on(target: Endpoint, queue: str) -> Todo:
    return Todo.open(id=UUID(int=1), now=T0, actor="operator:cli", endpoint_id=target.endpoint_id, queue=queue,
                     source="operator", title="t", trust_mode="operator")


MINE, THEIRS = endpoint("mine-0001", "alice"), endpoint("theirs-0001", "bob")


@pytest.mark.parametrize(("caller", "target", "queue", "allowed"), [
    (Caller.cli(), THEIRS, QUARANTINE, True),
    (Caller.operator("alice"), MINE, QUARANTINE, True),
    (Caller.operator("alice"), THEIRS, "work", False),
    (Caller("endpoint", "mine-0001"), MINE, "work", True),
    (Caller("endpoint", "mine-0001"), MINE, QUARANTINE, False),  # an agent never sees quarantine
    (Caller("endpoint", "mine-0001"), THEIRS, "work", False),
    (Caller("system", "bootstrap"), MINE, "work", False),
])
def test_who_may_touch_a_todo(caller, target, queue, allowed):
    assert may_touch(caller, target, todo_on(target, queue)) is allowed


def test_an_agent_may_touch_its_own_endpoint_and_no_other():
    agent = Caller("endpoint", "mine-0001")
    assert may_touch(agent, MINE) and not may_touch(agent, THEIRS)


def test_an_authenticated_endpoint_is_judged_by_its_scope_alone():
    scope = scope_of(MINE)
    assert in_scope(scope, todo_on(MINE, "work"))
    assert not in_scope(scope, todo_on(MINE, QUARANTINE))
    assert not in_scope(scope, todo_on(THEIRS, "work"))


def test_an_operator_vends_for_itself_and_sees_its_own_endpoints_only():
    assert vend_owner(Caller.operator("alice"), None) == "alice"
    with pytest.raises(Forbidden):
        vend_owner(Caller.operator("alice"), "bob")
    assert vend_owner(Caller.cli(), None) == "admin" and vend_owner(Caller.cli(), "bob") == "bob"
    assert visible_owner(Caller.operator("alice")) == "alice" and visible_owner(Caller.cli()) is None
