"""The command line's parsing: the parser class (a usage error exits 2), the usage error argparse cannot
catch, and JSON values given inline or as a file."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from domain.errors import InvalidArgument
from interfaces.cli.output import EXIT_USAGE

AddCommand = Callable[[Any, str, Callable[..., int], str], argparse.ArgumentParser]
"""`command(subparsers, name, handler, help)`: adds one command with the common options (`build_parser`)."""


class Usage(Exception):
    """A malformed command line that argparse could not catch (exit 2)."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def parse_json_arg(text: str, what: str, *, bare_path: bool = False) -> Any:
    """A JSON value given inline or as @file; with `bare_path`, text that does not start a JSON
    object or list is a path too (`--rules rules.json`). A failure names the file."""
    path: str | None = None
    if text.startswith("@"):
        path = text[1:]
    elif bare_path and text.lstrip()[:1] not in ("{", "["):
        path = text
    if path is None:
        return _json_of(text, what)
    try:
        content = Path(path).read_text()
    except OSError as error:
        raise InvalidArgument(f"cannot read {what} file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise InvalidArgument(f"{what} file {path} is not UTF-8 text") from None
    return _json_of(content, f"{what} file {path}")


def read_json_file(text: str, what: str) -> Any:
    """The JSON document in a file named as `path` or `@path`."""
    return parse_json_arg(text if text.startswith("@") else "@" + text, what)


def _json_of(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument(f"{what} is not valid JSON: {error.msg} (line {error.lineno} column {error.colno})"
                              ) from None
