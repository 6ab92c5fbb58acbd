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
