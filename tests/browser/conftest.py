"""Fixtures of the browser tests: Playwright driving Debian's Chromium against a real `switchboard serve`.

One headless Chromium per module; one server (SQLite) per module, signed in through the login form
once, its cookies then reused by every fresh browser context. Every page a test opens records its
console errors and uncaught exceptions (a CSP violation is a console error); a test fails if any
were not expected. Without /usr/bin/chromium the tests skip, or fail when
SWITCHBOARD_REQUIRE_BROWSER=1 (as in CI). With SWITCHBOARD_SCREENSHOTS=<dir>, `screenshot(page,
name)` saves `<dir>/<name>.png`. Live-update latencies measured by the tests are printed at the end.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._ingest import StackCli
from tests.e2e._support import Server

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--disable-quic"]
REQUIRE_BROWSER = os.environ.get("SWITCHBOARD_REQUIRE_BROWSER") == "1"
SCREENSHOTS = os.environ.get("SWITCHBOARD_SCREENSHOTS")
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
LATENCIES: list[tuple[str, float]] = []


def _unavailable(reason: str) -> None:
    if REQUIRE_BROWSER:
        pytest.fail(f"SWITCHBOARD_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian's package, launched once per module. Not per session: Playwright's
    sync API keeps an event loop running in this thread while it is open, and the MCP tests of other
    modules need to run their own (asyncio.run)."""
    if not CHROMIUM.exists():
        _unavailable("Debian's chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the Python package playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Console:
    """Console errors and uncaught exceptions of one page; `allow` tolerates an expected one."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        self.allowed: list[re.Pattern[str]] = []
        page.on("console", lambda msg: self.errors.append(f"console.{msg.type}: {msg.text} @ {page.url}")
                if msg.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error} @ {page.url}"))

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]


class Board:
    """The module's server, its CLI (minting URLs with the server's base) and the admin's password."""

    def __init__(self, server: Server, cli: StackCli, password: str) -> None:
        self.server = server
        self.cli = cli
        self.base = server.base
        self.password = password
        self.state: dict[str, Any] | None = None  # the signed-in admin's cookies

    def sign_in(self, page: Any, name: str = "admin", password: str | None = None) -> None:
        """Signs in through the login form, as a person would, and waits for the Todos view."""
        from playwright.sync_api import expect

        page.goto("/login")
        page.get_by_label("Name").fill(name)
        page.get_by_label("Password").fill(password or self.password)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", level=1, name="Todos")).to_be_visible()


def start_board(data_dir: Path, url: str) -> Board:
    server = Server(data_dir, data_dir, url=url, SWITCHBOARD_INGEST_RATE="0").start()
    try:
        server.wait_healthy()
    except BaseException:
        server.stop()
        raise
    return Board(server, StackCli(url, data_dir, server.base), (data_dir / "admin-password").read_text().strip())


def stop_board(board: Board) -> None:
    code = board.server.stop()
    assert code == 0, board.server.output()
    assert "Traceback" not in board.server.stderr(), board.server.output()


@pytest.fixture(scope="module")
def board(browser, tmp_path_factory) -> Iterator[Board]:
    """A `switchboard serve` on SQLite for the module, with the admin signed in once."""
    data_dir = tmp_path_factory.mktemp("browser")
    board = start_board(data_dir, f"sqlite:///{data_dir}/switchboard.db")
    try:
        context = browser.new_context(base_url=board.base, viewport=DESKTOP)
        try:
            board.sign_in(context.new_page())
            board.state = context.storage_state()
        finally:
            context.close()
        yield board
    finally:
        stop_board(board)


@pytest.fixture
def open_page(browser, board) -> Iterator[Callable[..., Any]]:
    """Opens a page in a fresh browser context: signed in as admin unless `signed_in=False`.

    Each page's console is watched; at teardown every page must have logged no unexpected error.
    """
    opened: list[tuple[Any, Console]] = []

    def open_(viewport: dict[str, int] = DESKTOP, *, signed_in: bool = True, base: str | None = None,
              state: dict[str, Any] | None = None) -> Any:
        context = browser.new_context(base_url=base or board.base, viewport=viewport,
                                      storage_state=(state or board.state) if signed_in else None)
        context.set_default_timeout(10_000)
        page = context.new_page()
        page.console = Console(page)
        opened.append((context, page.console))
        return page

    yield open_
    problems = []
    for context, console in opened:
        problems += console.unexpected()
        context.close()
    assert not problems, "errors in the browser console:\n" + "\n".join(problems)


@pytest.fixture
def screenshot() -> Callable[..., None]:
    """`screenshot(page, name)`: a PNG in $SWITCHBOARD_SCREENSHOTS, when it is set."""

    def take(page: Any, name: str, *, full_page: bool = True) -> None:
        if not SCREENSHOTS:
            return
        target = Path(SCREENSHOTS)
        target.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target / f"{name}.png"), full_page=full_page)

    return take


@pytest.fixture
def latency() -> Callable[[str, float], None]:
    """Records a measured live-update latency (seconds), printed in the terminal summary."""
    return lambda what, seconds: LATENCIES.append((what, seconds))


def pytest_terminal_summary(terminalreporter) -> None:
    if LATENCIES:
        terminalreporter.section("board live-update latency")
        for what, seconds in LATENCIES:
            terminalreporter.write_line(f"{seconds * 1000:6.0f} ms  {what}")
