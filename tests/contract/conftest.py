"""Every test in tests/contract/ runs once on SQLite and once on a fresh PostgreSQL database
(the `store_url` fixture of tests/conftest.py), through the application layer only.
"""

from __future__ import annotations

import pytest

from .harness import Harness, container_on


@pytest.fixture
def sb(store_url, make_container, clock) -> Harness:
    """The application on this test's store, with operator `admin` and the clock at 2026-01-01."""
    container = container_on(make_container, store_url, clock)
    container.app.ensure_admin()
    return Harness(container, clock, store_url, make_container)
