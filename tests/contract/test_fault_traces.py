"""Why a quarantined todo is held, read without loading it (the board's quarantine view), on both stores."""

from __future__ import annotations

from application.service import Caller

from .harness import CLI, agent
from .test_webhooks import code_of, quarantined


def test_an_operator_reads_the_fault_trace_of_its_quarantined_todos_only(sb):
    todo_id, owner = quarantined(sb)
    pushed = sb.push(owner)["id"]
    trace = sb.app.get_todo(todo_id, caller=CLI)["routing"]
    assert trace["stage"] == "fault" and trace["rule_id"] == "boom"

    assert sb.app.fault_traces([todo_id, pushed], caller=Caller.operator("admin")) == {todo_id: trace}
    assert sb.app.fault_traces([todo_id], caller=CLI) == {todo_id: trace}
    sb.app.create_operator("bob", "a long enough password", caller=CLI)
    assert sb.app.fault_traces([todo_id], caller=Caller.operator("bob")) == {}
    assert code_of(lambda: sb.app.fault_traces([todo_id], caller=agent(owner))) == "forbidden"
    assert sb.app.fault_traces([], caller=CLI) == {}


def test_the_fault_traces_rebuild_from_the_log_like_every_read_model(sb):
    todo_id, owner = quarantined(sb)
    before = sb.app.fault_traces([todo_id], caller=CLI)
    assert before
    sb.container.projector.rebuild()
    assert sb.container.projector.verify() == []
    assert sb.app.fault_traces([todo_id], caller=CLI) == before


def test_a_released_todo_keeps_the_reason_it_was_held(sb):
    todo_id, owner = quarantined(sb)
    sb.app.release_quarantined(todo_id, owner["queues"][0], caller=CLI)
    assert list(sb.app.fault_traces([todo_id], caller=CLI)) == [todo_id]


