"""The controllable clock (SWITCHBOARD_CLOCK_FILE, a test hook): wall time plus the seconds in a
file, followed as the file changes, inert unless set (docs/adr/0029-controllable-clock.md)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from application.errors import ConfigurationError
from application.ports import SystemClock
from interfaces.clock import FileOffsetClock, clock_of
from interfaces.settings import Settings


def write(path: Path, text: str) -> None:
    """As a test steps the clock: a new file renamed over the old one."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def offset_now(clock: FileOffsetClock) -> float:
    """The offset the clock adds to the wall clock now, in seconds (checked to be what `now()` adds)."""
    before = datetime.now(timezone.utc)
    now = clock.now()
    offset = clock.offset()
    assert before + offset <= now <= datetime.now(timezone.utc) + offset
    return offset.total_seconds()


def test_the_clock_is_wall_time_plus_the_seconds_in_the_file_and_follows_each_step(tmp_path):
    path = tmp_path / "clock"
    write(path, "0")
    clock = FileOffsetClock(path)
    assert offset_now(clock) == 0
    seen = []
    for seconds in ("60", "60.5", "-2.25", " 3600\n"):  # several steps within one mtime tick
        write(path, seconds)
        seen.append(offset_now(clock))
    assert seen == [60, 60.5, -2.25, 3600]
    assert clock.now().tzinfo is not None


def test_a_file_gone_or_garbled_keeps_the_last_offset_with_one_log_line_then_one_when_it_is_back(tmp_path, caplog):
    path = tmp_path / "clock"
    write(path, "120")
    clock = FileOffsetClock(path)
    assert offset_now(clock) == 120
    write(path, "soon")
    assert offset_now(clock) == 120
    assert offset_now(clock) == 120
    path.unlink()
    assert offset_now(clock) == 120
    warnings = [r.getMessage() for r in caplog.records if r.name == "switchboard.clock"]
    assert len(warnings) == 1 and "keeping the offset 120.0 s" in warnings[0], warnings
    write(path, "30")
    assert offset_now(clock) == 30
    assert offset_now(clock) == 30
    warnings = [r.getMessage() for r in caplog.records if r.name == "switchboard.clock"]
    assert len(warnings) == 2 and "readable again, offset 30.0 s" in warnings[1], warnings


def test_a_missing_file_reads_as_no_offset_until_it_is_written(tmp_path):
    clock = FileOffsetClock(tmp_path / "not-yet")
    assert offset_now(clock) == 0
    write(tmp_path / "not-yet", "90")
    assert offset_now(clock) == 90


def test_unset_the_process_has_the_system_clock():
    assert isinstance(clock_of(Settings.from_env({}).clock_file), SystemClock)


def test_set_the_setting_names_the_file_and_serve_refuses_one_that_holds_no_number(tmp_path):
    path = tmp_path / "clock"
    settings = Settings.from_env({"SWITCHBOARD_CLOCK_FILE": str(path)})
    assert settings.clock_file == str(path)
    with pytest.raises(ConfigurationError, match="No such file"):
        settings.check()
    for garbled in ("", "ten", "nan", "inf"):
        write(path, garbled)
        with pytest.raises(ConfigurationError, match="must hold a number of seconds"):
            settings.check()
    write(path, "300")
    settings.check()
    clock = clock_of(settings.clock_file)
    assert isinstance(clock, FileOffsetClock)
    assert abs(clock.now() - datetime.now(timezone.utc) - timedelta(seconds=300)) < timedelta(seconds=1)
