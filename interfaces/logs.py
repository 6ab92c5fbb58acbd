"""One log format and level for every process `serve` runs: the server (with Litestar's own
`litestar` logger, see `interfaces.http.app.litestar_logging`) and the projector child."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVEL = logging.WARNING


def configure_logging() -> None:
    """The root logger writes LOG_FORMAT to stderr from LOG_LEVEL up (a process calls it once)."""
    logging.basicConfig(level=LOG_LEVEL, format=LOG_FORMAT)
