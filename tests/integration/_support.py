"""Helpers shared by the integration tests (and others): an operator-vended endpoint, bulk pushes and
dead letters made quickly."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from application.service import Caller, Switchboard
from domain.todo import MAX_ATTEMPTS

CLI = Caller.cli()


def vend_worker(app: Switchboard, *, queues: tuple[str, ...] = ("work",)) -> Caller:
    """Vends an endpoint (creating operator `admin` on an empty store); returns it as a caller."""
    app.ensure_admin()
    vended = app.vend("worker", queues=list(queues), caller=CLI)
    return Caller("endpoint", vended["slug"])


def push_many(apps: list[Switchboard], slug: str, count: int, *, threads: int = 8) -> list[str]:
    """Pushes `count` todos from `threads` threads, spread over the given apps; returns their ids."""

    def push(i: int) -> str:
        answer = apps[i % len(apps)].push(slug, f"todo {i}", caller=CLI, payload={"n": i})
        assert answer["created"] is True
        return answer["todo"]["id"]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(push, range(count)))


def dead_letters(app: Switchboard, slug: str, count: int, *, threads: int = 8) -> set[str]:
    """`count` dead letters of the endpoint's first queue, made by real commands and quickly: pushed,
    then claimed 100 at a time and released (a release has no backoff) until their attempts are
    spent; concurrent commands share the writer's batches. Their ids."""
    agent = Caller("endpoint", slug)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        todos = set(pool.map(lambda i: app.push(slug, f"doomed {i}", caller=CLI)["todo"]["id"], range(count)))
        for _ in range(MAX_ATTEMPTS):
            claimed: list[str] = []
            while batch := app.claim_next(caller=agent, max_todos=100)["todos"]:
                claimed += [todo["id"] for todo in batch]
            assert set(claimed) == todos, "another queue or endpoint's todos were claimed"
            rows = list(pool.map(lambda todo: app.release(todo, caller=agent), claimed))
    assert all(row["state"] == "failed" and row["dead_letter"] for row in rows)
    return todos


def most_claimed_at_once(log: Iterable[tuple[str, str, Any]]) -> int:
    """The most todos claimed at once, replaying (event type, todo id, …) of claims and claim ends
    in commit order."""
    claimed: set[str] = set()
    most = 0
    for kind, todo, *_ in log:
        if kind == "TodoClaimed":
            claimed.add(todo)
        else:
            claimed.discard(todo)
        most = max(most, len(claimed))
    return most


def most_in_any_window(times: Sequence[datetime], window: timedelta) -> int:
    """The most of these times in any half-open window [t, t + window) (each starting at one of them)."""
    return max((sum(1 for t in times if start <= t < start + window) for start in times), default=0)


def history_types(app: Switchboard, todo_id: str) -> list[str]:
    return [e["type"] for e in app.history(todo_id, caller=CLI)["events"]]


def count_rows(app: Switchboard, **filters: Any) -> int:
    """How many todo rows the read model holds (list_todos with a limit above any test's size)."""
    return len(app.list_todos(caller=CLI, limit=100_000, max_limit=100_000, **filters))
