"""`switchboard endpoint`: vending, listing and revoking agent endpoints."""

from __future__ import annotations

from domain.endpoint import parse_lifetime
from domain.errors import InvalidArgument
from domain.names import DEFAULT_SOURCE_TYPES, SOURCE_TYPES
from interfaces.cli.arguments import AddCommand, Parser, Usage
from interfaces.cli.container import CLI, act, closing, open_container
from interfaces.cli.output import EXIT_OK, Output, table


def parse_ttl(text: str) -> int | None:
    """`<n>s|m|h|d` in seconds, or None for `never`."""
    try:
        return parse_lifetime(text)
    except InvalidArgument:
        raise Usage(f"bad --ttl {text!r}: expected <n>s|m|h|d or never") from None


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_endpoint_vend(args, out: Output) -> int:
    ttl_seconds = parse_ttl(args.ttl)  # a usage error before the store is touched
    with closing(open_container(args)) as c:
        result = c.app.vend(
            args.agent, queues=args.queue, caller=CLI,
            verbs=comma_list(args.verbs) if args.verbs is not None else None,
            webhook_max=args.webhook_max,
            source_types=comma_list(args.source_types) if args.source_types is not None else None,
            webhook_queues=args.webhook_queue, ttl_seconds=ttl_seconds,
            default_lease_seconds=args.default_lease, owner=args.owner,
        )
    out.emit(result)
    return EXIT_OK


def cmd_endpoint_list(args, out: Output) -> int:
    with closing(open_container(args)) as c:
        rows = c.app.list_endpoints(caller=CLI)
    out.emit({"endpoints": rows}, lambda d: table(
        [r | {"queues": ",".join(r["queues"]), "state": "revoked" if r["revoked"] else "active"} for r in d["endpoints"]],
        ("slug", "endpoint_id", "owner", "queues", "state", "expires_at"),
    ))
    return EXIT_OK


def cmd_endpoint_revoke(args, out: Output) -> int:
    return act(args, out, lambda c: c.app.revoke(args.ref, caller=CLI),
        lambda r: f"endpoint {r['slug']} revoked; {r['released_leases']} lease(s) released")


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    endpoint = groups.add_parser("endpoint", help="agent endpoints").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(endpoint, "vend", cmd_endpoint_vend, "vend an endpoint (the credential is shown once)")
    p.add_argument("agent")
    p.add_argument("--queue", action="append", required=True)
    p.add_argument("--verbs")
    p.add_argument("--webhook-max", type=int)
    p.add_argument("--source-types", help=f"comma list of {','.join(SOURCE_TYPES)}"
                                           f" (default {','.join(DEFAULT_SOURCE_TYPES)})")
    p.add_argument("--webhook-queue", action="append")
    p.add_argument("--ttl", default="never")
    p.add_argument("--default-lease", type=int)
    p.add_argument("--owner")
    command(endpoint, "list", cmd_endpoint_list, "list endpoints")
    p = command(endpoint, "revoke", cmd_endpoint_revoke, "revoke an endpoint at once")
    p.add_argument("ref", metavar="SLUG_OR_ID")
