"""`switchboard queue`: an endpoint's queues, their pause and limits."""

from __future__ import annotations

from typing import Any

from interfaces.cli.arguments import AddCommand, Parser, Usage
from interfaces.cli.container import CLI, act
from interfaces.cli.output import Output, table


def parse_limit(text: str) -> int | None:
    """A queue limit: a whole number, or `none` (no limit); the range is the application's."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise Usage(f"bad limit {text!r}: expected a whole number or none") from None


QUEUE_COLUMNS = ("queue", "paused", "max_in_flight", "max_claims_per_minute", "in_flight", "claims_last_minute")


def cmd_queue_list(args, out: Output) -> int:
    return act(args, out, lambda c: c.app.queue_controls(args.endpoint, caller=CLI),
               lambda r: table(r["queues"], QUEUE_COLUMNS))


def cmd_queue_set(args, out: Output) -> int:
    changes: dict[str, Any] = {}
    if args.pause is not None:
        changes["paused"] = args.pause
    if args.max_in_flight is not None:
        changes["max_in_flight"] = parse_limit(args.max_in_flight)
    if args.rate is not None:
        changes["max_claims_per_minute"] = parse_limit(args.rate)
    if not changes:
        raise Usage("say what to set: --pause, --resume, --max-in-flight N|none or --rate N|none")
    return act(args, out, lambda c: c.app.set_queue_controls(args.endpoint, args.queue, caller=CLI, **changes),
               lambda r: table([r], QUEUE_COLUMNS))


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    queue = groups.add_parser("queue", help="queue controls").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(queue, "list", cmd_queue_list, "an endpoint's queues with their controls and load")
    p.add_argument("endpoint", metavar="ENDPOINT")
    p = command(queue, "set", cmd_queue_set, "pause, resume or limit one of an endpoint's queues")
    p.add_argument("endpoint", metavar="ENDPOINT")
    p.add_argument("queue", metavar="QUEUE")
    pause = p.add_mutually_exclusive_group()
    pause.add_argument("--pause", dest="pause", action="store_const", const=True, default=None)
    pause.add_argument("--resume", dest="pause", action="store_const", const=False)
    p.add_argument("--max-in-flight", metavar="N|none", help="claimed todos at once, 1..10000, or none")
    p.add_argument("--rate", metavar="N|none", help="claims in any 60 s window, 1..100000, or none")
