"""`switchboard todo`: pushing, listing and reading todos (in full, their history, their story), and
the operator's hands on failed and quarantined ones."""

from __future__ import annotations

import json
from typing import Any

from domain.errors import InvalidArgument
from domain.queue import parse_delay
from interfaces.cli.arguments import AddCommand, Parser, Usage, parse_json_arg
from interfaces.cli.container import CLI, act, closing, open_container
from interfaces.cli.output import EXIT_OK, Output, more_hint, pairs, table


TODO_COLUMNS = ("id", "queue", "state", "attempt", "owner", "created_at", "available_at", "title")
"""`todo list` text: `available_at` tells a delayed (or held: empty) pending todo from a claimable one."""


def parse_delay_arg(text: str) -> float:
    try:
        return parse_delay(text).total_seconds()
    except InvalidArgument:
        raise Usage(f"bad --delay {text!r}: expected <n>s|m|h|d") from None


def cmd_todo_push(args, out: Output) -> int:
    payload = parse_json_arg(args.payload, "payload") if args.payload is not None else None
    return act(
        args, out,
        lambda c: c.app.push(args.endpoint, args.title, caller=CLI, queue=args.queue, payload=payload, key=args.key,
                             not_before=args.not_before,
                             delay_seconds=parse_delay_arg(args.delay) if args.delay is not None else None),
        lambda r: f"{r['todo']['id']} {'created' if r['created'] else 'exists'} on {r['todo']['queue']}"
                  + (f", claimable from {r['todo']['available_at']}" if args.not_before or args.delay else ""),
    )


def cmd_todo_list(args, out: Output) -> int:
    with closing(open_container(args)) as c:
        page = c.app.page_todos(caller=CLI, endpoint=args.endpoint, state=args.state, queue=args.queue,
                                limit=args.limit, cursor=args.cursor)
    out.emit(page, lambda d: table(d["todos"], TODO_COLUMNS))
    if not out.as_json:
        more_hint(page, "todos", args.argv)
    return EXIT_OK


def _pruned_shown(document: dict[str, Any]) -> dict[str, Any]:
    """A pruned payload or result as the sentence every surface shows (CONTRACT §14)."""
    shown = dict(document)
    for name in ("payload", "result"):
        note = shown.pop(f"{name}_pruned", None)
        if note is not None:
            shown[name] = note["text"]
    return shown


def cmd_todo_show(args, out: Output) -> int:
    return act(args, out, lambda c: c.app.get_todo(args.id, caller=CLI), lambda t: pairs(_pruned_shown(t)))


def cmd_todo_retry(args, out: Output) -> int:
    if args.dead_letters or args.endpoint is not None:
        if args.id is not None or not (args.dead_letters and args.endpoint):
            raise Usage("retry either one todo (ID) or, with --endpoint E --dead-letters, its dead letters")
        return act(args, out, lambda c: c.app.bulk_retry(args.endpoint, caller=CLI, dead_letters=True,
                                                         queue=args.queue, dry_run=args.dry_run),
                   lambda r: (f"would retry {r['would_retry']} dead letter(s)" if "would_retry" in r
                              else f"retried {r['retried']} dead letter(s) (bulk action {r['bulk_action_id']})"))
    if args.id is None or args.queue is not None or args.dry_run:
        raise Usage("retry either one todo (ID) or, with --endpoint E --dead-letters, its dead letters")
    return act(args, out, lambda c: c.app.retry(args.id, caller=CLI),
        lambda r: f"{r['id']} {r['state']} (attempt {r['attempt']}/{r['max_attempts']})")


def cmd_todo_move(args, out: Output) -> int:
    return act(args, out, lambda c: c.app.release_quarantined(args.id, args.queue, caller=CLI),
               lambda r: f"{r['id']} released from quarantine to {r['queue']}: {r['state']}")


def cmd_todo_discard(args, out: Output) -> int:
    return act(args, out, lambda c: c.app.discard_quarantined(args.id, caller=CLI, summary=args.summary),
               lambda r: f"{r['id']} discarded: {r['state']}")


BULKY_FIELDS = ("payload", "result")  # shown by size and digest in text: they can be megabytes


def _digest_line(name: str, ref: dict[str, Any]) -> str:
    """`payload: 22,016 bytes, sha256 <hex>`: of the stored bytes the event names (the raw body of
    a delivery, as `payload_size`, the audit export and a prune's note say; an event from before
    payloads were stored once is read with the reference of its inline value, `domain.payloads.upcast`)."""
    return f"{name}: {ref['size']:,} bytes, sha256 {ref['sha256']}"


def _history_text(d: dict[str, Any]) -> str:
    lines = []
    for e in d["events"]:
        data = {k: v for k, v in e["data"].items() if k not in BULKY_FIELDS or v is None}
        lines.append(f"{e['position']:>8}  v{e['version']:<3} {e['time']}  {e['type']:<14} {e['actor']:<28} "
                     f"{e['cause']:<16} " + json.dumps(data, separators=(",", ":"), ensure_ascii=False))
        lines += [" " * 10 + _digest_line(k, ref) for k, ref in e.get("digests", {}).items()
                  if e["data"].get(k) is not None]  # shown (not pruned, not left out)
    return "\n".join(lines)


def cmd_todo_history(args, out: Output) -> int:
    with closing(open_container(args)) as c:
        history = c.app.history(args.id, caller=CLI)
    out.emit({"events": history["events"]}, _history_text)
    return EXIT_OK


def _explain_text(d: dict[str, Any]) -> str:
    """The because first, then the story, one sentence a line with its time, then the attempts."""
    attempts = [f"  {a['n']:>3}  {a['outcome']:<9} {a['claimed_at']} .. {a['ended_at'] or 'now':<20}  "
                f"{a['traceparent']}  {a['claimant'] or '-'}{'  (checkpoint)' if 'checkpoint' in a else ''}"
                for a in d.get("attempts", ())]
    return "\n".join([d["because"], ""] + [f"{s['time']}  {s['text']}" for s in d["story"]]
                     + (["", "attempts:"] + attempts if attempts else []))


def cmd_todo_explain(args, out: Output) -> int:
    with closing(open_container(args)) as c:
        explained = c.app.explain(args.id, caller=CLI)
    out.emit(explained, _explain_text)
    return EXIT_OK


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    todo = groups.add_parser("todo", help="todos").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(todo, "push", cmd_todo_push, "push an operator-authored todo")
    p.add_argument("endpoint")
    p.add_argument("title")
    p.add_argument("--queue")
    p.add_argument("--payload", help="JSON or @file")
    p.add_argument("--key", help="idempotency key")
    later = p.add_mutually_exclusive_group()
    later.add_argument("--not-before", metavar="TIME", help="RFC 3339 time before which it is not claimable")
    later.add_argument("--delay", metavar="DURATION", help="not claimable for <n>s|m|h|d from now (e.g. 10m)")
    p = command(todo, "list", cmd_todo_list, "list todos, newest first")
    p.add_argument("--endpoint")
    p.add_argument("--state")
    p.add_argument("--queue")
    p.add_argument("--limit", type=int, default=50, help="rows per page, 1..1000 (default 50)")
    p.add_argument("--cursor", help="continue after a previous page (its next_cursor)")
    for name, func, help_text in (
        ("show", cmd_todo_show, "show a todo in full"),
        ("history", cmd_todo_history, "every domain event of a todo (payloads by size and digest; --json whole)"),
        ("explain", cmd_todo_explain, "a todo's story in sentences and why it is in its state (--json: {state, because, story})"),
    ):
        command(todo, name, func, help_text).add_argument("id")
    p = command(todo, "retry", cmd_todo_retry, "retry a failed todo now, with a fresh budget; with --endpoint E"
                " --dead-letters, every dead letter of the endpoint (or of --queue Q) in one bulk action")
    p.add_argument("id", nargs="?")
    p.add_argument("--endpoint")
    p.add_argument("--dead-letters", action="store_true")
    p.add_argument("--queue")
    p.add_argument("--dry-run", action="store_true", help="say how many would be retried; change nothing")
    p = command(todo, "move", cmd_todo_move, "release a quarantined (held or faulted) todo to a queue of its endpoint")
    p.add_argument("id")
    p.add_argument("--queue", required=True)
    p = command(todo, "discard", cmd_todo_discard, "end a quarantined todo without work (done, no result)")
    p.add_argument("id")
    p.add_argument("--summary", help="why (kept in its history)")
