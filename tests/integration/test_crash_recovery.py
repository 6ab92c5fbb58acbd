"""Crash recovery: a process killed with SIGKILL mid-workload loses nothing it acknowledged,
and projections resume from their tracked positions without gaps or duplicates.

The workload (tests/integration/_workload.py) is a real separate process with the background
scheduler and projection catch-up running, so the kill lands in the middle of event appends
and of catch-up transactions alike.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from tests.integration._support import CLI, count_rows, vend_worker

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).with_name("_workload.py")
RUN_FOR = 1.5  # seconds of workload between "ready" and the kill
EVENT_OF = {
    "push": "TodoOpened", "claim": "TodoClaimed", "complete": "TodoCompleted",
    "fail": "TodoFailed", "release": "TodoReleased",
}


def run_and_kill(url: str, data_dir: Path, slug: str, run_for: float = RUN_FOR) -> list[tuple[str, str]]:
    """Starts the workload, lets it run, kills it with SIGKILL; returns its acknowledged transitions."""
    process = subprocess.Popen(
        [sys.executable, str(WORKLOAD), url, str(data_dir), slug, "4"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            if not line.endswith("\n"):
                break  # cut short by the kill: never acknowledged
            if line == "ready\n":
                ready.set()
            else:
                lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(30), f"the workload never got ready: {process.stderr.read() if process.poll() is not None else ''}"
        time.sleep(run_for)
        assert process.poll() is None, f"the workload died on its own:\n{process.stderr.read()}"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    reader.join(10)
    stderr = process.stderr.read()
    assert "Traceback" not in stderr, stderr
    acks = []
    for line in lines:
        word, verb, todo_id = line.split()
        assert word == "ack" and verb in EVENT_OF, line
        acks.append((verb, todo_id))
    return acks


def assert_acknowledged_transitions_are_logged(app, acks: list[tuple[str, str]]) -> None:
    acked: dict[str, Counter] = {}
    last: dict[str, str] = {}
    for verb, todo_id in acks:
        acked.setdefault(todo_id, Counter())[EVENT_OF[verb]] += 1
        last[todo_id] = verb
    for todo_id, wanted in acked.items():
        logged = Counter(e["type"] for e in app.history(todo_id, caller=CLI)["events"])
        for event_type, n in wanted.items():
            assert logged[event_type] >= n, (
                f"{todo_id}: {n} acknowledged {event_type}, {logged[event_type]} in the log"
            )
        state = app.get_todo(todo_id, caller=CLI)["state"]
        if last[todo_id] == "complete":
            assert state == "done", (todo_id, state)
        elif last[todo_id] == "fail":  # its retry is 30 s away: nothing moves it meanwhile
            assert state == "failed", (todo_id, state)


def assert_projections_consistent(container) -> None:
    app, projector = container.app, container.projector
    assert projector.verify() == []  # as left by the crash, at each projection's own position
    projector.catch_up()
    assert projector.verify() == []
    assert set(projector.lag().values()) == {0}
    opened = sum(1 for record in app.audit() if record["type"] == "TodoOpened")
    assert count_rows(app) == opened


def test_a_killed_process_loses_no_acknowledged_transition_and_projections_resume(
    store_url, make_container, tmp_path,
):
    setup = make_container(store_url)
    worker = vend_worker(setup.app)

    first = run_and_kill(store_url, tmp_path, worker.name)
    assert Counter(v for v, _ in first)["complete"] > 0, first[:20]
    checker = make_container(store_url)
    assert_acknowledged_transitions_are_logged(checker.app, first)
    assert_projections_consistent(checker)
    left_pending = {row["id"] for row in checker.app.list_todos(caller=CLI, state="pending", limit=1000)}

    # Restarted on the same store, the workload carries on where the log stands (it claims
    # the todos the first run left pending too); killed again, nothing is lost either.
    second = run_and_kill(store_url, tmp_path, worker.name, run_for=1.0)
    assert Counter(v for v, _ in second)["complete"] > 0, second[:20]
    if left_pending:  # claim_next takes the oldest first: the first run's leftovers
        assert left_pending & {todo_id for verb, todo_id in second if verb == "claim"}
    assert_acknowledged_transitions_are_logged(checker.app, first + second)
    fresh = make_container(store_url)
    assert_projections_consistent(fresh)
    print(f"\n{store_url.split(':')[0]}: acknowledged {len(first)} + {len(second)} transitions before the kills")
