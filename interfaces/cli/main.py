"""The `switchboard` command line (CONTRACT §2, §11): thin adapters over the application.

Exit codes: 0 ok, 1 refused (or the store/settings unusable), 2 usage error.
`--json` (anywhere on the line) prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from application.errors import ConfigurationError, StoreUnavailable
from domain.errors import DomainError
from interfaces.cli import admin, audit, endpoints, events, queues, read_models, retention, rules, serve, todos, webhooks
from interfaces.cli.arguments import Parser, Usage
from interfaces.cli.output import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, Output

GROUPS = (serve, admin, endpoints, todos, queues, webhooks, rules, events, read_models, retention, audit)
"""The modules of the command groups, each adding its parsers (`add_parsers`), in the order `--help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", default=argparse.SUPPRESS,
                        help="sqlite:///PATH or postgresql://user[:pw]@host[:port]/db (default: $SWITCHBOARD_DATABASE_URL)")
    common.add_argument("--base-url", default=argparse.SUPPRESS,
                        help="prefix of minted MCP and ingest URLs (default: $SWITCHBOARD_BASE_URL, else the one"
                             " serve recorded in the store, else http://127.0.0.1:8080)")
    parser = Parser(prog="switchboard", description="Webhooks in, durable leased todos out, for AI agents.",
                    parents=[common])
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    groups = parser.add_subparsers(dest="group", required=True, parser_class=Parser)

    def command(sub, name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    for group in GROUPS:
        group.add_parsers(groups, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; a reader that closes the pipe early (`… | head -1`) is not an error."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would turn into exit 120
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK
    return code


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    out = Output(as_json)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if not hasattr(args, "database_url"):
        args.database_url = None
    if not hasattr(args, "base_url"):
        args.base_url = None
    try:
        return args.func(args, out)
    except Usage as error:
        print(f"switchboard: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except DomainError as error:
        print(f"error: {error.code}: {error.message}", file=sys.stderr)
        if as_json:
            print(json.dumps({"error": error.message, "code": error.code}))
        return EXIT_REFUSED
    except (ConfigurationError, StoreUnavailable) as error:
        code = "unavailable" if isinstance(error, StoreUnavailable) else "invalid_configuration"
        print(f"error: {code}: {error}", file=sys.stderr)
        if as_json:
            print(json.dumps({"error": str(error), "code": code}))
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
