"""claim_next with `max` (issue 16): several todos in one call, one lease and one attempt each."""

from __future__ import annotations

import threading

import pytest

from domain.errors import Conflict, InvalidArgument

from .harness import CLI, agent


def test_claim_next_with_max_takes_that_many_oldest_first_each_with_its_own_lease(sb):
    vended = sb.vend("worker")
    pushed = []
    for n in range(5):
        pushed.append(sb.push(vended, f"todo {n}")["id"])
        sb.tick(1)

    answer = sb.app.claim_next(caller=agent(vended), max_todos=3, lease_ttl_seconds=120, claimant="batcher")

    assert answer["empty"] is False and "todo" not in answer
    assert [t["id"] for t in answer["todos"]] == pushed[:3]
    for todo in answer["todos"]:
        assert (todo["state"], todo["attempt"], todo["attempt_seq"]) == ("claimed", 1, 1)
        assert todo["lease_expires_at"] is not None and "payload" in todo and "lease_token" not in todo
    assert [r["state"] for r in sb.app.list_todos(caller=CLI)] == ["pending", "pending", "claimed", "claimed",
                                                                   "claimed"]
    for todo in answer["todos"]:  # each lease is finished on its own
        assert sb.app.complete(todo["id"], caller=agent(vended))["state"] == "done"

    rest = sb.app.claim_next(caller=agent(vended), max_todos=100)
    assert [t["id"] for t in rest["todos"]] == pushed[3:]
    assert sb.app.claim_next(caller=agent(vended), max_todos=10) == {"empty": True, "todos": []}
    assert sb.app.claim_next(caller=agent(vended)) == {"empty": True}  # without max: the answer as before


def test_a_fenced_batch_carries_one_token_per_todo(sb):
    vended = sb.vend("worker")
    for n in range(2):
        sb.push(vended, f"todo {n}")
    first, second = sb.app.claim_next(caller=agent(vended), max_todos=2, require_fence=True)["todos"]
    assert first["lease_token"] and second["lease_token"] and first["lease_token"] != second["lease_token"]
    with pytest.raises(Conflict):
        sb.app.complete(first["id"], caller=agent(vended), lease_token=second["lease_token"])
    assert sb.app.complete(first["id"], caller=agent(vended), lease_token=first["lease_token"])["state"] == "done"


@pytest.mark.parametrize("bad", [0, -1, 101, True])
def test_max_out_of_range_is_refused(sb, bad):
    vended = sb.vend("worker")
    sb.push(vended)
    with pytest.raises(InvalidArgument):
        sb.app.claim_next(caller=agent(vended), max_todos=bad)
    assert sb.app.list_todos(caller=CLI)[0]["state"] == "pending"


def test_concurrent_batches_never_share_a_todo(sb):
    vended = sb.vend("worker")
    for n in range(30):
        sb.push(vended, f"todo {n}")
    apps = [sb.app, sb.another_process().app]
    got: list[list[str]] = [[], [], [], []]
    barrier = threading.Barrier(4)

    def claimer(i: int) -> None:
        barrier.wait()
        while True:
            answer = apps[i % 2].claim_next(caller=agent(vended), max_todos=4)
            if answer["empty"]:
                return
            got[i] += [t["id"] for t in answer["todos"]]

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    taken = [todo for ids in got for todo in ids]
    assert len(taken) == len(set(taken)) == 30
