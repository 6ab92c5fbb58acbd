"""The process's clock, built once from the settings (`clock_of`): the system clock, or — a test
hook, never for production — the system clock plus an offset that a test moves from outside.

`SWITCHBOARD_CLOCK_FILE=/path` names a file holding a number of seconds (`180`, `-2.5`). Every
process started with it (`serve`, its projector child, the CLI) reads the time as UTC wall time
plus that many seconds, so one test can step the time of several `serve` processes at once
(docs/adr/0029-controllable-clock.md). The file is looked at on every reading (one `stat`) and
read again only when it changed (inode, mtime, size): write it by renaming a new file over it,
so a reader never sees half of it. Unset, nothing here is used: the system clock, untouched.
"""

from __future__ import annotations

import logging
import math
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from application.errors import ConfigurationError
from application.ports import Clock, SystemClock

log = logging.getLogger("switchboard.clock")


def read_offset(path: str | Path) -> timedelta:
    """The offset a clock file holds: a finite number of seconds (a ConfigurationError naming the
    file if it cannot be read or is not one)."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigurationError(f"SWITCHBOARD_CLOCK_FILE {path}: {error.strerror or error}") from None
    try:
        seconds = float(text.strip())
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ConfigurationError(f"SWITCHBOARD_CLOCK_FILE {path} must hold a number of seconds, not {text.strip()[:40]!r}")
    return timedelta(seconds=seconds)


class FileOffsetClock:
    """UTC wall time plus the offset in a file (a test hook): re-read when the file changes; a file
    gone or unreadable keeps the last offset (one log line then, one when it is readable again)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._seen: tuple[tuple[int, int, int] | None, timedelta] = (None, timedelta(0))
        """(the file's inode, mtime and size when last read, the offset it held): one attribute,
        so a reader on another thread sees both or neither."""
        self._complained = False

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset()

    def offset(self) -> timedelta:
        stamp, offset = self._seen
        try:
            info = os.stat(self.path)
            current = (info.st_ino, info.st_mtime_ns, info.st_size)
            if current != stamp:
                offset = read_offset(self.path)
                self._seen = (current, offset)
            if self._complained:
                log.warning("clock file %s: readable again, offset %s s", self.path, offset.total_seconds())
                self._complained = False
        except (OSError, ConfigurationError) as error:
            if not self._complained:
                log.warning("clock file %s: %s; keeping the offset %s s", self.path,
                            getattr(error, "strerror", None) or error, offset.total_seconds())
                self._complained = True
        return offset


def clock_of(clock_file: str | None) -> Clock:
    """The one clock of a process: the system clock, or the file-offset clock when a clock file is
    set (SWITCHBOARD_CLOCK_FILE)."""
    return SystemClock() if clock_file is None else FileOffsetClock(clock_file)
