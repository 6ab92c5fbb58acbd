"""`serve` prints one log format: Litestar's default logging config would replace the root
logger's handlers with its own format (`INFO - time - name - module - message`) at INFO, so
the server's lines and the projector child's differed. Run in a fresh interpreter, in serve's
order (the app first, then `configure_logging`), so nothing else has configured logging."""

from __future__ import annotations

import re
import subprocess
import sys

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING (switchboard\.http|litestar): seen$")

SCRIPT = """
import logging, sys
from interfaces.bootstrap import build
from interfaces.http.app import create_app
from interfaces.logs import configure_logging
from interfaces.settings import Settings

container = build(Settings(database_url=f"sqlite:///{sys.argv[1]}/s.db", data_dir=sys.argv[1]))
app = create_app(container)
configure_logging()
logging.getLogger("switchboard.http").warning("seen")
app.logger.warning("seen")
logging.getLogger("switchboard.doorbell").info("below the level: not shown")
container.close()
"""


def test_the_server_and_litestar_log_in_the_one_format_at_warning(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and all(LINE.match(line) for line in lines), run.stderr
