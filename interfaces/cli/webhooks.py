"""`switchboard webhook`: creating, listing, rotating and deleting webhooks, and whom they trust."""

from __future__ import annotations

from typing import Any

from domain.names import SOURCE_TYPES
from interfaces.cli.arguments import AddCommand, Parser, Usage
from interfaces.cli.container import CLI, act
from interfaces.cli.output import Output, table


def cmd_webhook_create(args, out: Output) -> int:
    return act(args, out, lambda c: c.webhooks.create(
        caller=CLI, endpoint=args.endpoint, source_type=args.source, target_queue=args.queue))


def cmd_webhook_list(args, out: Output) -> int:
    columns = ("webhook_id", "endpoint_id", "source_type", "target_queue", "trust_mode", "routes",
               "trusted_senders", "trusted_associations", "created_at")
    def shown(row: dict[str, Any]) -> dict[str, Any]:
        return {k: ",".join(v) if isinstance(v, list) else v for k, v in row.items()}

    return act(args, out, lambda c: c.webhooks.list(caller=CLI, endpoint=args.endpoint),
               lambda d: table([shown(r) for r in d["webhooks"]], columns))


def cmd_webhook_rotate(args, out: Output) -> int:
    return act(args, out, lambda c: c.webhooks.rotate(args.id, caller=CLI))


def cmd_webhook_delete(args, out: Output) -> int:
    return act(args, out, lambda c: c.webhooks.delete(args.id, caller=CLI),
        lambda r: f"webhook {r['webhook_id']} deleted")


def cmd_webhook_trust(args, out: Output) -> int:
    if args.clear == bool(args.sender or args.association):
        raise Usage("give --sender and/or --association, or --clear alone")
    return act(args, out, lambda c: c.webhooks.set_trust(
        args.webhook, caller=CLI, senders=args.sender, associations=args.association),
        lambda r: f"webhook {r['webhook_id']} trusts "
                  + (", ".join([*r["trusted_senders"], *r["trusted_associations"]]) or "every sender"))


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    webhook = groups.add_parser("webhook", help="webhooks").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(webhook, "create", cmd_webhook_create, "create a webhook (the URL and signing secret are shown once)")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--source", required=True, metavar="TYPE", help=f"the sender: {', '.join(SOURCE_TYPES)}")
    p.add_argument("--queue", required=True)
    p = command(webhook, "list", cmd_webhook_list, "list webhooks (never secrets)")
    p.add_argument("--endpoint")
    for name, func, help_text in (
        ("rotate", cmd_webhook_rotate, "new URL and secret; the old ones stop working at once"),
        ("delete", cmd_webhook_delete, "delete a webhook"),
    ):
        command(webhook, name, func, help_text).add_argument("id")

    p = command(webhook, "trust", cmd_webhook_trust,
                "who may create work through a github or gitea webhook (replaces the setting)")
    p.add_argument("webhook")
    p.add_argument("--sender", action="append", metavar="LOGIN", help="a trusted login (repeat)")
    p.add_argument("--association", action="append", metavar="A",
                   help="a trusted author association: OWNER, MEMBER, COLLABORATOR or CONTRIBUTOR (repeat)")
    p.add_argument("--clear", action="store_true", help="trust every sender again")
