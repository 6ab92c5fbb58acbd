"""Opening the application for one command: settings from the environment and the command line, the
container built from them, closed when the command is done."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from application.service import Caller
from interfaces.cli.output import EXIT_OK, Output
from interfaces.settings import Settings

CLI = Caller.cli()  # the CLI acts with every operator's rights


def open_container(args: argparse.Namespace):
    from interfaces.bootstrap import build

    settings = Settings.from_env().with_overrides(database_url=args.database_url)
    if args.base_url is not None:
        settings = settings.with_overrides(base_url=args.base_url, base_url_explicit=True)
    container = build(settings)
    if not settings.base_url_explicit:  # mint URLs with the base URL `serve` recorded, if any
        recorded = container.app.recorded_base_url()
        if recorded is not None:
            container.app.base_url = recorded
    return container


def act(args, out: Output, call: Callable[[Any], Any], text: Callable[[Any], str] | None = None) -> int:
    """Builds the container, runs one application call, prints its answer."""
    with closing(open_container(args)) as c:
        result = call(c)
    out.emit(result, text)
    return EXIT_OK


class closing:
    def __init__(self, container) -> None:
        self.container = container

    def __enter__(self):
        return self.container

    def __exit__(self, *exc) -> None:
        self.container.close()
