"""`switchboard events`: the stored deliveries, listed and shown one at a time."""

from __future__ import annotations

import json
from typing import Any

from interfaces.cli.arguments import AddCommand, Parser
from interfaces.cli.container import CLI, act, closing, open_container
from interfaces.cli.output import EXIT_OK, Output, more_hint, pairs, table


def cmd_events_list(args, out: Output) -> int:
    columns = ("id", "delivery_id", "webhook_id", "source", "kind", "trust_mode", "verified", "disposition",
               "todos_created", "received_at")
    with closing(open_container(args)) as c:
        page = c.webhooks.list_events(caller=CLI, webhook_id=args.webhook, limit=args.limit, max_limit=1000,
                                      cursor=args.cursor)
    out.emit(page, lambda d: table(d["events"], columns))
    if not out.as_json:
        more_hint(page, "events", args.argv)
    return EXIT_OK


def _event_text(event: dict[str, Any]) -> str:
    """The delivery's facts, its headers one per line, then its body as received."""
    facts = {k: v for k, v in event.items() if k not in ("headers", "payload", "body")}
    lines = [pairs(facts), "headers:"]
    lines += [f"  {name}: {value}" for name, value in event["headers"].items()]
    facts.pop("payload_pruned", None)
    if event.get("payload_pruned"):
        body = event["payload_pruned"]["text"]
    else:
        body = event["body"] if event["body"] is not None else json.dumps(event["payload"], indent=2, ensure_ascii=False)
    lines.append(f"body ({event['size']:,} bytes):")
    lines.append(body)
    return "\n".join(lines)


def cmd_events_show(args, out: Output) -> int:
    # the text shows the body as received (a JSON body too, not re-encoded); --json the parsed payload
    return act(args, out, lambda c: c.webhooks.get_event(args.id, caller=CLI, raw_body=not out.as_json), _event_text)


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    events = groups.add_parser("events", help="stored deliveries").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(events, "list", cmd_events_list, "stored deliveries, newest first")
    p.add_argument("--webhook")
    p.add_argument("--limit", type=int, default=50, help="rows per page, 1..1000 (default 50)")
    p.add_argument("--cursor", help="continue after a previous page (its next_cursor)")
    command(events, "show", cmd_events_show, "one delivery with redacted headers").add_argument("id")
