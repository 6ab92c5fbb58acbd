"""Idempotency keys on push (CONTRACT §4 idempotency, §2 `todo push --key`)."""

from __future__ import annotations

import threading

from .harness import CLI, agent, unique


def push_keyed(sb, vended, key, title="keyed"):
    return sb.app.push(vended["slug"], title, caller=CLI, key=key)


def test_the_same_key_while_the_todo_is_live_returns_that_todo(sb):
    vended = sb.vend("worker")
    key = unique("key")
    first = push_keyed(sb, vended, key)
    assert first["created"] is True
    todo_id = first["todo"]["id"]

    def again():
        answer = push_keyed(sb, vended, key, title="a different title")
        assert (answer["created"], answer["todo"]["id"]) == (False, todo_id)
        return answer["todo"]

    assert again()["state"] == "pending"
    sb.app.claim(todo_id, caller=agent(vended))
    assert again()["state"] == "claimed"
    sb.app.fail(todo_id, caller=agent(vended))
    assert again()["state"] == "failed"
    assert len(sb.app.list_todos(caller=CLI)) == 1


def test_the_same_key_after_complete_opens_a_new_todo(sb):
    vended = sb.vend("worker")
    key = unique("key")
    first = push_keyed(sb, vended, key)["todo"]
    sb.app.claim(first["id"], caller=agent(vended))
    sb.app.complete(first["id"], caller=agent(vended))

    second = push_keyed(sb, vended, key)

    assert second["created"] is True and second["todo"]["id"] != first["id"]
    assert second["todo"]["state"] == "pending"
    third = push_keyed(sb, vended, key)
    assert (third["created"], third["todo"]["id"]) == (False, second["todo"]["id"])


def test_the_same_key_after_a_dead_letter_opens_a_new_todo(sb):
    vended = sb.vend("worker")
    key = unique("key")
    first = push_keyed(sb, vended, key)["todo"]
    sb.fail_until_dead(vended, first["id"])

    second = push_keyed(sb, vended, key)

    assert second["created"] is True and second["todo"]["id"] != first["id"]
    assert push_keyed(sb, vended, key)["todo"]["id"] == second["todo"]["id"]


def test_keys_are_per_endpoint(sb):
    one, two = sb.vend("one"), sb.vend("two")
    key = unique("key")

    first, second = push_keyed(sb, one, key), push_keyed(sb, two, key)

    assert first["created"] is second["created"] is True
    assert first["todo"]["id"] != second["todo"]["id"]


def test_concurrent_pushes_with_one_key_open_exactly_one_todo_across_processes(sb):
    apps = [sb.app, sb.another_process().app]
    vended = sb.vend("worker")
    key = unique("key")
    answers, errors = [], []
    start = threading.Barrier(8)

    def push(app):
        start.wait()
        try:
            answers.append(app.push(vended["slug"], "keyed", caller=CLI, key=key))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=push, args=(app,)) for app in apps * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sum(a["created"] for a in answers) == 1
    assert len({a["todo"]["id"] for a in answers}) == 1
    assert len(sb.app.list_todos(caller=CLI)) == 1
