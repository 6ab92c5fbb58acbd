"""Listing todos (CONTRACT §6 rows, §8 'an operator sees only its own', §11 limits)."""

from __future__ import annotations

import pytest

from application.service import Caller
from domain.errors import Forbidden, InvalidArgument, NotFound

from .harness import CLI, agent, mixed_workload, unique

ROW_KEYS = {
    "id", "queue", "source", "kind", "title", "state", "trust_mode", "owner", "attempt",
    "max_attempts", "lease_expires_at", "next_retry_at", "dead_letter", "created_at", "payload_size",
    "available_at",  # CONTRACT §13
}


def ids(rows):
    return [r["id"] for r in rows]


def test_rows_are_newest_first_and_never_carry_the_payload(sb):
    vended = sb.vend("worker")
    pushed = []
    for n in range(4):
        pushed.append(sb.push(vended, f"todo {n}", payload={"secret": n})["id"])
        sb.tick()

    rows = sb.app.list_todos(caller=CLI, endpoint=vended["slug"])

    assert ids(rows) == pushed[::-1]
    assert all(set(r) == ROW_KEYS for r in rows)
    assert [r["created_at"] for r in rows] == [f"2026-01-01T00:00:0{n}Z" for n in (3, 2, 1, 0)]


def test_list_todos_filters_by_state(sb):
    vended = sb.vend("worker")
    done, claimed, pending, failed = (sb.push(vended)["id"] for _ in range(4))
    for todo_id in (done, claimed, failed):
        sb.app.claim(todo_id, caller=agent(vended))
    sb.app.complete(done, caller=agent(vended))
    sb.app.fail(failed, caller=agent(vended))

    by_state = {s: ids(sb.app.list_todos(caller=CLI, state=s)) for s in ("pending", "claimed", "done", "failed")}

    assert by_state == {"pending": [pending], "claimed": [claimed], "done": [done], "failed": [failed]}
    with pytest.raises(InvalidArgument):
        sb.app.list_todos(caller=CLI, state="sleeping")


def test_list_todos_filters_by_queue(sb):
    first, second = unique("a"), unique("b")
    vended = sb.vend("worker", queues=[first, second])
    in_first = sb.push(vended, queue=first)["id"]
    in_second = sb.push(vended, queue=second)["id"]

    assert ids(sb.app.list_todos(caller=CLI, queue=first)) == [in_first]
    assert ids(sb.app.list_todos(caller=agent(vended), queue=second)) == [in_second]
    with pytest.raises(Forbidden):
        sb.app.list_todos(caller=agent(vended), queue=unique("elsewhere"))


def test_list_todos_filters_by_endpoint_slug_or_id(sb):
    queue = unique("shared")
    one, two = sb.vend("one", queues=[queue]), sb.vend("two", queues=[queue])
    mine = sb.push(one)["id"]
    theirs = sb.push(two)["id"]

    assert ids(sb.app.list_todos(caller=CLI, endpoint=one["slug"])) == [mine]
    assert ids(sb.app.list_todos(caller=CLI, endpoint=two["endpoint_id"])) == [theirs]
    assert ids(sb.app.list_todos(caller=agent(one))) == [mine]
    assert set(ids(sb.app.list_todos(caller=CLI))) == {mine, theirs}
    with pytest.raises(NotFound):
        sb.app.list_todos(caller=CLI, endpoint=unique("nobody"))


def test_list_todos_limit_is_1_to_1000(sb):
    vended = sb.vend("worker")
    pushed = []
    for _ in range(3):
        pushed.append(sb.push(vended)["id"])
        sb.tick()

    assert ids(sb.app.list_todos(caller=CLI, limit=2)) == pushed[:0:-1]
    assert len(sb.app.list_todos(caller=CLI, limit=1)) == 1
    assert len(sb.app.list_todos(caller=CLI, limit=1000)) == 3
    for bad in (0, 1001, -1):
        with pytest.raises(InvalidArgument):
            sb.app.list_todos(caller=CLI, limit=bad)


def test_an_operator_sees_only_its_own_endpoints_and_their_todos(sb):
    bob = unique("bob")
    sb.app.create_operator(bob, "password123", caller=CLI)
    queue = unique("shared")
    admins = sb.vend("admins", queues=[queue])
    bobs = sb.vend("bobs", queues=[queue], owner=bob)
    admin_todo = sb.push(admins)["id"]
    bob_todo = sb.push(bobs)["id"]
    as_bob, as_admin = Caller.operator(bob), Caller.operator("admin")

    assert ids(sb.app.list_todos(caller=as_bob)) == [bob_todo]
    assert ids(sb.app.list_todos(caller=as_admin)) == [admin_todo]
    assert ids(sb.app.list_todos(caller=as_bob, endpoint=bobs["slug"])) == [bob_todo]
    with pytest.raises(NotFound):
        sb.app.list_todos(caller=as_bob, endpoint=admins["slug"])
    assert [e["slug"] for e in sb.app.list_endpoints(caller=as_bob)] == [bobs["slug"]]
    with pytest.raises(NotFound):
        sb.app.get_todo(admin_todo, caller=as_bob)
    assert sb.app.get_todo(bob_todo, caller=as_bob)["id"] == bob_todo
    with pytest.raises(NotFound):
        sb.app.push(admins["slug"], "not yours", caller=as_bob)
    with pytest.raises(NotFound):
        sb.app.revoke(admins["slug"], caller=as_bob)


def test_an_operator_cannot_vend_for_another_operator(sb):
    bob = unique("bob")
    sb.app.create_operator(bob, "password123", caller=CLI)

    with pytest.raises(Forbidden):
        sb.app.vend(unique("w"), queues=[unique("q")], caller=Caller.operator(bob), owner="admin")
    vended = sb.app.vend(unique("w"), queues=[unique("q")], caller=Caller.operator(bob))
    assert [e["owner"] for e in sb.app.list_endpoints(caller=CLI) if e["slug"] == vended["slug"]] == [bob]


def test_rows_agree_with_the_full_todos_in_every_state(sb):
    todos = mixed_workload(sb)

    rows = {r["id"]: r for r in sb.app.list_todos(caller=CLI, limit=1000)}

    assert set(rows) == set(todos.values())
    for name, todo_id in todos.items():
        full = sb.todo(todo_id)
        assert rows[todo_id] == {k: full[k] for k in ROW_KEYS}, name
    states = {(r["state"], r["dead_letter"], r["next_retry_at"] is not None) for r in rows.values()}
    assert states == {
        ("pending", False, False), ("claimed", False, False), ("done", False, False),
        ("failed", False, True), ("failed", True, False),
    }


def test_rows_keep_times_to_the_microsecond(sb):
    vended = sb.vend("worker")
    sb.tick(0.123457)
    todo = sb.push(vended)
    sb.tick(1.000001)
    sb.app.claim(todo["id"], caller=agent(vended), lease_ttl_seconds=10.5)

    (row,) = sb.app.list_todos(caller=CLI)
    full = sb.todo(todo["id"])

    assert (row["created_at"], row["lease_expires_at"]) == (full["created_at"], full["lease_expires_at"])
    assert row["created_at"] == "2026-01-01T00:00:00.123457Z"
    assert row["lease_expires_at"] == "2026-01-01T00:00:11.623458Z"


def test_a_long_listing_continues_by_cursor_and_never_stops_silently(sb):
    """121 todos, many at the same instant: pages of 50 carry next_cursor until the last one."""
    vended = sb.vend("pager")
    pushed = []
    for n in range(121):
        pushed.append(sb.push(vended, f"todo {n}")["id"])
        if n % 40 == 39:
            sb.tick()  # runs of todos opened at the same microsecond: the id breaks the tie
    expected = ids(sb.app.list_todos(caller=CLI, endpoint=vended["slug"], limit=1000))
    assert sorted(expected) == sorted(pushed)

    pages, cursor = [], None
    while True:
        page = sb.app.page_todos(caller=CLI, endpoint=vended["slug"], cursor=cursor)
        pages.append(ids(page["todos"]))
        cursor = page.get("next_cursor")
        if cursor is None:
            break
    assert [len(p) for p in pages] == [50, 50, 21]
    assert [todo_id for p in pages for todo_id in p] == expected

    exact = sb.app.page_todos(caller=CLI, endpoint=vended["slug"], limit=121)
    assert len(exact["todos"]) == 121 and "next_cursor" not in exact  # no more rows: no cursor
    # the agent's own listing pages the same way (MCP list_todos)
    mine = sb.app.page_todos(caller=agent(vended), limit=120)
    assert len(mine["todos"]) == 120
    assert ids(sb.app.page_todos(caller=agent(vended), cursor=mine["next_cursor"])["todos"]) == expected[120:]
    for bad in ("", "nonsense", "12.td_xyz", f"{2**63}.{pushed[0]}", "1.2.3"):
        with pytest.raises(InvalidArgument):
            sb.app.page_todos(caller=CLI, cursor=bad)
