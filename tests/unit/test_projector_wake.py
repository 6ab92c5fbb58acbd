"""`serve` wakes its projector process with a byte on the child's stdin, at most one per
WAKE_EVERY (interfaces/projector_process.py): a burst of commits is one wake-up, not one each."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from interfaces.projector_process import WAKE_EVERY, ProjectorProcess
from interfaces.settings import Settings


def _counting_child() -> subprocess.Popen:
    """Stands in for the projector: counts the bytes it is sent until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    os.set_blocking(proc.stdin.fileno(), False)
    return proc


def test_a_burst_of_commits_sends_one_byte_per_wake_window(tmp_path):
    projector = ProjectorProcess(Settings(data_dir=str(tmp_path)))
    projector.proc = child = _counting_child()
    try:
        started = time.monotonic()
        wakes = 0
        while time.monotonic() - started < 5 * WAKE_EVERY:  # a commit every ~0.5 ms
            projector.wake()
            wakes += 1
            time.sleep(0.0005)
        elapsed = time.monotonic() - started
        time.sleep(WAKE_EVERY)
        projector.wake()  # a commit after a quiet window wakes the child again
    finally:
        child.stdin.close()
        sent = int(child.stdout.read())
        child.wait(timeout=10)
    assert wakes > 20
    assert 2 <= sent <= elapsed / WAKE_EVERY + 2, (sent, wakes)
