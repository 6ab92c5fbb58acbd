"""A workload for the crash-recovery test, run as its own process and killed with SIGKILL.

    python tests/integration/_workload.py DATABASE_URL DATA_DIR ENDPOINT_SLUG [THREADS]

Runs `serve`'s background work (the scheduler and the projection catch-up) and THREADS
loops of push, claim_next, then complete, fail or release. After each command RETURNS
(its events are durable) it prints one line, `ack <verb> <todo id>`, flushed at once: the
test holds every printed line to be in the event log, whenever the process dies.
"""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from application.service import Caller  # noqa: E402
from interfaces.bootstrap import Background, build  # noqa: E402
from interfaces.settings import Settings  # noqa: E402

_out = threading.Lock()


def say(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def work(app, slug: str, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    cli, worker = Caller.cli(), Caller("endpoint", slug)
    n = 0
    while not stop.is_set():
        n += 1
        todo_id = app.push(slug, f"crash {seed}/{n}", caller=cli, payload={"n": n})["todo"]["id"]
        say(f"ack push {todo_id}")
        answer = app.claim_next(caller=worker, lease_ttl_seconds=120, claimant=f"w{seed}")
        if answer["empty"]:
            continue
        todo_id = answer["todo"]["id"]
        say(f"ack claim {todo_id}")
        roll = rng.random()
        if roll < 0.6:
            app.complete(todo_id, caller=worker, result={"n": n})
            say(f"ack complete {todo_id}")
        elif roll < 0.8:
            app.fail(todo_id, caller=worker, summary="flaky")
            say(f"ack fail {todo_id}")
        else:
            app.release(todo_id, caller=worker)
            say(f"ack release {todo_id}")


def main() -> None:
    url, data_dir, slug = sys.argv[1:4]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    container = build(Settings(database_url=url, data_dir=data_dir))
    Background(container).start()
    stop = threading.Event()
    workers = [
        threading.Thread(target=work, args=(container.app, slug, seed, stop), daemon=True)
        for seed in range(threads)
    ]
    say("ready")
    for thread in workers:
        thread.start()
    for thread in workers:  # runs until killed
        thread.join()


if __name__ == "__main__":
    main()
