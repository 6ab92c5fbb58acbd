"""Helpers shared by the integration tests: an operator-vended endpoint and bulk pushes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from application.service import Caller, Switchboard

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


def history_types(app: Switchboard, todo_id: str) -> list[str]:
    return [e["type"] for e in app.history(todo_id, caller=CLI)["events"]]


def count_rows(app: Switchboard, **filters: Any) -> int:
    """How many todo rows the read model holds (list_todos with a limit above any test's size)."""
    return len(app.list_todos(caller=CLI, limit=100_000, max_limit=100_000, **filters))
