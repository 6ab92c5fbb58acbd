"""`switchboard retention prune`: removing the stored payloads of finished work, and what it gave back
on disk."""

from __future__ import annotations

from typing import Any

from domain.errors import InvalidArgument
from domain.retention import parse_age
from interfaces.cli.arguments import AddCommand, Parser, Usage
from interfaces.cli.container import CLI, act
from interfaces.cli.output import Output
from interfaces.store.views import CHECKPOINT_WAIT_MS, RECLAIM_LOCK_WAIT_MS


def cmd_retention_prune(args, out: Output) -> int:
    def text(r: dict[str, Any]) -> str:
        verb = "would remove" if r["dry_run"] else "removed"
        line = (f"{verb} {r['payloads']} stored payloads ({r['bytes']:,} bytes) of {r['todos']} todos and"
                f" {r['deliveries']} deliveries finished before {r['cutoff']}")
        if "store_bytes_before" in r:
            line += f"; payload store {r['store_bytes_before']:,} -> {r['store_bytes_after']:,} bytes on disk"
            if r.get("vacuumed"):
                line += f" after VACUUM of {', '.join(r['vacuumed'])}"
            if r.get("reclaim") == "busy":
                line += (f"\n--reclaim did not run: the payload store stayed in use for {RECLAIM_LOCK_WAIT_MS / 1000:g} s"
                         " (nothing was rewritten); the freed space is reused by new payloads; run it again in a"
                         " quieter moment")
            elif r.get("space") == "store":
                line += ("\nthe freed space is reused by new payloads; the files keep their size"
                         " (--reclaim gives it back to the system, locking the payload store while it runs)")
            elif r.get("space") is None:
                line += "\nVACUUM did not run (see the log): the next prune or autovacuum frees the space"
            elif r.get("checkpoint") == "busy":
                line += (f"\nthe checkpoint waited {CHECKPOINT_WAIT_MS / 1000:g} s for readers and gave up: the -wal file"
                         " still holds the copy VACUUM wrote; a later checkpoint shrinks the database file, and"
                         " --reclaim in a quieter moment runs VACUUM and this checkpoint again, emptying the -wal file")
            elif r["payloads"] and r["store_bytes_after"] >= r["store_bytes_before"]:
                line += ("\nnothing on disk was given back: the bytes pruned came to less than the room the"
                         " prune's own event and the tombstone each pruned payload keeps (its digest, size and"
                         " time) take; expected on a small store, on a larger one the file shrinks")
        return line

    try:
        age = parse_age(args.older_than)
    except InvalidArgument as error:
        raise Usage(f"bad --older-than {args.older_than!r}: {error}") from None
    if args.reclaim and args.dry_run:
        raise Usage("--reclaim rewrites the payload store; --dry-run removes nothing: give one of them")
    return act(args, out, lambda c: c.retention.prune(age, caller=CLI, dry_run=args.dry_run, reclaim=args.reclaim),
               text)


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    retention = groups.add_parser("retention", help="stored payloads of finished work").add_subparsers(
        dest="action", required=True, parser_class=Parser)
    p = command(retention, "prune", cmd_retention_prune,
                "remove the stored bodies, payloads and results of work finished longer ago than --older-than")
    p.add_argument("--older-than", required=True, metavar="AGE", help="<n>s|m|h|d, e.g. 30d")
    p.add_argument("--dry-run", action="store_true", help="count what would go, remove nothing")
    p.add_argument("--reclaim", action="store_true",
                   help="PostgreSQL: VACUUM FULL the payload store afterwards, giving the freed space back to the"
                        " system; it locks the payload store (ingest, pushes, payload reads wait) while it runs."
                        " SQLite: VACUUM and checkpoint even when nothing is left to prune")
