"""Why each quarantined todo was held: the routing trace of a todo opened in quarantine — by a
rule fault (stage `fault`), an untrusted sender (stage `untrusted`) or a `{"quarantine": true}`
action (stage `rule` or `default`).

The board's quarantine view shows the fault's reason on each row without loading the todos
(whose payloads may be megabytes); rows never carry the trace (CONTRACT §6).
"""

from __future__ import annotations

from domain.events import DomainEvent
from domain.names import QUARANTINE, TODO_PREFIX, format_id
from domain.todo import TODO_EVENTS, TodoOpened
from projections.base import Op, as_json


class FaultTraces:
    name = "fault_traces"
    inline = False
    tables = ("sb_fault_traces",)
    ddl = ("CREATE TABLE IF NOT EXISTS sb_fault_traces (todo_id TEXT PRIMARY KEY, routing TEXT NOT NULL)",)
    ignores = tuple(e for e in TODO_EVENTS if e is not TodoOpened)  # the reason a todo was held never changes

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        match event:
            case TodoOpened(queue=queue, routing=routing) if queue == QUARANTINE and routing:
                return [("INSERT INTO sb_fault_traces (todo_id, routing) VALUES (%s, %s)",
                         (format_id(TODO_PREFIX, event.originator_id), as_json(routing)))]
        return []
