"""`switchboard serve`: the HTTP server and the background work."""

from __future__ import annotations

import argparse

from interfaces.cli.arguments import AddCommand
from interfaces.cli.output import Output
from interfaces.settings import Settings


def cmd_serve(args: argparse.Namespace, out: Output) -> int:
    from interfaces.http.server import serve

    settings = Settings.from_env().with_overrides(
        database_url=args.database_url, host=args.host, port=args.port, base_url=args.base_url,
        data_dir=args.data_dir,
    )
    if args.base_url is not None:
        settings = settings.with_overrides(base_url_explicit=True)
    if not settings.base_url_explicit:
        settings = settings.with_overrides(base_url=settings.listen_url())
    return serve(settings)


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    serve = command(groups, "serve", cmd_serve, "serve HTTP (board, API, ingest, MCP, metrics) and background work")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir")
