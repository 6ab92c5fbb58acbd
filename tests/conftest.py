"""Shared fixtures: real SQLite files and real PostgreSQL databases (one fresh database per test).

PostgreSQL tests skip with a reason when none is reachable, and fail instead when
SWITCHBOARD_REQUIRE_POSTGRES=1 (as in CI).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from application.ports import Clock
from tests.doubles import ManualClock
from interfaces.bootstrap import Container, build
from interfaces.settings import Settings

PG_ADMIN_URL = os.environ.get("SWITCHBOARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("SWITCHBOARD_REQUIRE_POSTGRES") == "1"
TEST_PG_SECRET_KEY = "5b" * 32  # the same as tests/e2e/_support.py's PG_SECRET_KEY


def _pg_reason() -> str | None:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return None
    except psycopg.Error as error:
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {str(error).strip().splitlines()[0]}"


_PG_UNAVAILABLE = _pg_reason()


_TEMPLATE: list[str] = []


def _template() -> str:
    """A database with the schema already created, copied for each test (much faster)."""
    if not _TEMPLATE:
        name = f"sb_tmpl_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        container = build(Settings(database_url=f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"))
        container.close()
        _TEMPLATE.append(name)
    return _TEMPLATE[0]


def pytest_sessionfinish(session, exitstatus) -> None:
    for name in _TEMPLATE:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_database() -> Iterator[str]:
    if _PG_UNAVAILABLE:
        if REQUIRE_PG:
            pytest.fail(f"SWITCHBOARD_REQUIRE_POSTGRES=1 but {_PG_UNAVAILABLE}")
        pytest.skip(_PG_UNAVAILABLE)
    name = f"sb_test_{uuid.uuid4().hex[:12]}"
    template = _template()
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test."""
    yield from pg_database()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/switchboard.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path) -> Iterator[str]:
    """The same test once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/switchboard.db"
    else:
        yield from pg_database()


@pytest.fixture
def make_container(tmp_path) -> Iterator[Callable[..., Container]]:
    """Builds containers on a URL (optionally with a clock); closes them after the test."""
    built: list[Container] = []

    def make(url: str, *, clock: Clock | None = None) -> Container:
        # on PostgreSQL a key must be explicit (CONTRACT §12); SQLite generates one in the data dir
        key = TEST_PG_SECRET_KEY if url.startswith("postgresql") else None
        container = build(Settings(database_url=url, data_dir=str(tmp_path), secret_key=key), clock=clock)
        built.append(container)
        return container

    yield make
    for container in built:
        container.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def module_store_url(request, tmp_path_factory) -> Iterator[str]:
    """Like `store_url`, but one store shared by a whole module (e.g. by one running server)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('store')}/switchboard.db"
    else:
        yield from pg_database()


@pytest.fixture(scope="module")
def module_pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database shared by a whole module."""
    yield from pg_database()
