"""A numeric setting that is not a number names its variable (CONTRACT §1: one clear line)."""

from __future__ import annotations

import pytest

from application.errors import ConfigurationError
from interfaces.settings import Settings


@pytest.mark.parametrize("name", ["SWITCHBOARD_PORT", "SWITCHBOARD_INGEST_RATE", "SWITCHBOARD_INGEST_BURST",
                                  "SWITCHBOARD_BODY_TIMEOUT", "SWITCHBOARD_PG_POOL_SIZE"])
def test_a_setting_that_is_not_a_number_is_named(name):
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({name: "abc"})
    assert str(refused.value) == f"{name} must be a number, not 'abc'"


@pytest.mark.parametrize(("name", "value"), [("SWITCHBOARD_INGEST_RATE", "-5"), ("SWITCHBOARD_INGEST_RATE", "nan"),
                                             ("SWITCHBOARD_INGEST_RATE", "inf"), ("SWITCHBOARD_INGEST_BURST", "-1")])
def test_a_negative_or_endless_ingest_rate_is_refused_at_start(name, value):
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({name: value}).check()
    assert str(refused.value).startswith(f"{name} must be")


def test_a_rate_of_zero_turns_the_limit_off_and_is_accepted():
    Settings.from_env({"SWITCHBOARD_INGEST_RATE": "0"}).check()
