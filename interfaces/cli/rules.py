"""`switchboard rules`: a webhook's routing rules, saved, dry-run on one delivery or replayed over the
last ones."""

from __future__ import annotations

import json
from typing import Any

from application.webhooks import DEFAULT_REPLAY_LAST, REPLAY_MAX
from interfaces.cli.arguments import AddCommand, Parser, Usage, parse_json_arg, read_json_file
from interfaces.cli.container import CLI, act
from interfaces.cli.output import Output


def _rules_text(r: dict[str, Any]) -> str:
    return json.dumps({k: r[k] for k in ("rules", "default_action", "params")}, indent=2)


def cmd_rules_get(args, out: Output) -> int:
    return act(args, out, lambda c: c.webhooks.rules(args.webhook, caller=CLI), _rules_text)


def cmd_rules_set(args, out: Output) -> int:
    document = read_json_file(args.file, "rules")
    return act(args, out, lambda c: c.webhooks.set_rules(args.webhook, document, caller=CLI), _rules_text)


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise Usage(f"bad --header {text!r}: expected Name:value")
    return name.strip(), value.strip()


def cmd_rules_test(args, out: Output) -> int:
    if (args.payload is None) == (args.event is None):
        raise Usage("give exactly one of --payload or --event")
    headers = dict(_header(h) for h in (args.header or []))
    payload = parse_json_arg(args.payload, "payload") if args.payload is not None else None
    candidate = parse_json_arg(args.rules, "rules", bare_path=True) if args.rules is not None else None
    return act(
        args, out,
        lambda c: c.webhooks.test_rules(args.webhook, caller=CLI, payload=payload, headers=headers, event_id=args.event,
                                        candidate=candidate, has_payload=args.payload is not None),
        _dry_run_text,
    )


def _dry_run_text(r: dict[str, Any]) -> str:
    """The decision, the rule that made it (numbered from 1, as people count), then the trace."""
    decision, trace = r["decision"], r["trace"]
    on = f" on {', '.join(decision['endpoints'])}" if decision["endpoints"] and not decision["drop"] else ""
    lines = [f"decision: {_decision_text(decision)}{on}"]
    index = trace.get("rule_index")
    rule = f"rule #{index + 1} ({trace.get('rule_id')})" if isinstance(index, int) else "the rules"
    if trace["stage"] == "rule":
        lines.append(f"matched: {rule}")
    elif trace["stage"] == "default":
        lines.append("matched: no rule (the default action)")
    elif trace["stage"] == "fault":
        lines.append(f"fault: {trace.get('reason', 'error')} in {rule}: {trace.get('detail', '')}")
    lines.append("trace: " + json.dumps(trace, ensure_ascii=False))
    return "\n".join(lines)


def _decision_text(decision: dict[str, Any]) -> str:
    """`queue:inbox`, `drop` or `faulted`, as the replay counts name decisions."""
    return "faulted" if decision["faulted"] else "drop" if decision["drop"] else f"queue:{decision['queue']}"


def _replay_text(r: dict[str, Any]) -> str:
    lines = [f"evaluated: {r['evaluated']}"] + [f"{k}: {v}" for k, v in sorted(r["decisions"].items())]
    for ch in r["changed"]:
        lines.append(f"changed: {ch['event_id']} {ch['kind'] or '-'} {ch['title']}")
        before, after = ch["before"], ch["after"]
        queued = not (before["drop"] or after["drop"] or before["faulted"] or after["faulted"])
        moved = "" if not queued or before["endpoints"] == after["endpoints"] else (
            f" (endpoints {', '.join(before['endpoints']) or '-'} -> {', '.join(after['endpoints']) or '-'})")
        lines.append(f"  {_decision_text(before)} -> {_decision_text(after)}{moved}")
    return "\n".join(lines)


def cmd_rules_replay(args, out: Output) -> int:
    candidate = parse_json_arg(args.rules, "rules", bare_path=True)
    return act(args, out, lambda c: c.webhooks.replay(args.webhook, candidate, caller=CLI, last=args.last),
               _replay_text)


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    rules = groups.add_parser("rules", help="routing rules").add_subparsers(dest="action", required=True, parser_class=Parser)
    command(rules, "get", cmd_rules_get, "show a webhook's rules").add_argument("webhook")
    p = command(rules, "set", cmd_rules_set, "validate, dry-run and save rules")
    p.add_argument("webhook")
    p.add_argument("--file", required=True, metavar="PATH",
                   help="rules.json (path or @path): {rules, default_action?, params?}")
    p = command(rules, "test", cmd_rules_test, "dry run on a payload or a stored delivery; saves nothing")
    p.add_argument("webhook")
    p.add_argument("--payload", help="JSON or @file")
    p.add_argument("--header", action="append", metavar="NAME:VALUE")
    p.add_argument("--event", metavar="EVENT_ID")
    p.add_argument("--rules", help="candidate {rules, default_action?, params?}: @path, path or inline JSON")
    p = command(rules, "replay", cmd_rules_replay, "candidate rules against the saved ones over the last N deliveries")
    p.add_argument("webhook")
    p.add_argument("--rules", required=True,
                   help="candidate {rules, default_action?, params?}: @path, path or inline JSON")
    p.add_argument("--last", type=int, default=None,
                   help=f"how many of the latest deliveries (default {DEFAULT_REPLAY_LAST}, at most {REPLAY_MAX})")
