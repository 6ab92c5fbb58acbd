"""`switchboard audit`: the event log exported as JSON lines, its hash chain verified (over the store or
an export file), and its head."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from application.audit import verify_lines
from domain.audit import Break
from domain.errors import InvalidArgument
from interfaces.cli.arguments import AddCommand, Parser
from interfaces.cli.container import closing, open_container
from interfaces.cli.output import EXIT_OK, EXIT_REFUSED, Output


def cmd_audit_export(args, out: Output) -> int:
    with closing(open_container(args)) as c:
        try:
            for record in c.audit.export(after=args.after, payloads=args.payloads):
                sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        except Break as broken:  # an event that cannot be read: the lines before it are out
            print(f"error: chain_broken: {broken}", file=sys.stderr)
            return EXIT_REFUSED
    return EXIT_OK


def cmd_audit_head(args, out: Output) -> int:
    with closing(open_container(args)) as c:
        head = c.audit.head()
    out.emit(head)
    return EXIT_OK


def cmd_audit_verify(args, out: Output) -> int:
    """Exit 0 with `chain intact: …`, or 1 naming the first bad position (stdout either way)."""
    from interfaces.store.chain import sorted_json

    try:
        if args.file is not None:
            verdict = verify_lines(_export_lines(args.file), JsonLines().parse, sorted_json)
        else:
            with closing(open_container(args)) as c:
                verdict = c.audit.verify()
    except Break as broken:
        out.emit({"intact": False, "position": broken.position, "kind": broken.kind, "detail": broken.detail,
                  "code": "chain_broken", "error": str(broken)}, lambda d: d["error"])
        return EXIT_REFUSED
    out.emit({"intact": True, "events": verdict.count, "head": verdict.head, "start": verdict.start,
              "unsealed": verdict.unsealed}, lambda d: str(verdict))
    return EXIT_OK


class JsonLines:
    """Parses export lines: each line's value, and whether it held a float."""

    def __init__(self) -> None:
        from interfaces.store.chain import FloatSpotter

        self._spotter = FloatSpotter()

    def parse(self, line: str) -> tuple[Any, bool]:
        import msgspec

        try:
            return self._spotter.decode(line)
        except msgspec.DecodeError as error:
            raise ValueError(str(error)) from None


def _export_lines(path: str) -> Callable[[], Any]:
    """The lines of an export file, each time called (`-` is stdin, read once and kept)."""
    if path == "-":
        kept = sys.stdin.read().splitlines()
        return lambda: kept
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise InvalidArgument(f"cannot read export file {path}: {error.strerror or error}") from None

    def lines():
        with open(path, encoding="utf-8", errors="strict") as handle:
            try:
                for line in handle:
                    if line.strip():
                        yield line
            except UnicodeDecodeError:
                raise InvalidArgument(f"export file {path} is not UTF-8 text") from None

    return lines


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    audit = groups.add_parser("audit", help="the event log").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(audit, "export", cmd_audit_export, "the event log as JSON lines, each with its prev_hash and hash")
    p.add_argument("--after", type=int, default=0, metavar="POSITION")
    p.add_argument("--payloads", action="store_true",
                   help="each line also carries the stored payloads its digests name (pruned ones absent)")
    p = command(audit, "verify", cmd_audit_verify,
                "re-compute the hash chain over the store, or over an export file (exit 1 names the first bad position)")
    p.add_argument("--file", metavar="EXPORT", help="an `audit export` file (`-`: stdin); the store is not opened")
    command(audit, "head", cmd_audit_head, "the last sealed link of the chain: {position, hash, time}")
