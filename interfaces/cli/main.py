"""The `switchboard` command line (CONTRACT §2, §11): thin adapters over the application.

Exit codes: 0 ok, 1 refused (or the store/settings unusable), 2 usage error.
`--json` (anywhere on the line) prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from application.audit import verify_lines
from application.errors import ConfigurationError, StoreUnavailable
from application.service import Caller
from application.webhooks import DEFAULT_REPLAY_LAST, REPLAY_MAX
from domain.audit import Break
from domain.endpoint import parse_lifetime
from domain.retention import parse_age
from domain.errors import DomainError, InvalidArgument
from domain.queue import parse_delay
from interfaces.settings import Settings
from interfaces.store.views import CHECKPOINT_WAIT_MS, RECLAIM_LOCK_WAIT_MS

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
CLI = Caller.cli()  # the CLI acts with every operator's rights


class Usage(Exception):
    """A malformed command line that argparse could not catch (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


# -- argument helpers ----------------------------------------------------------------------


def parse_ttl(text: str) -> int | None:
    """`<n>s|m|h|d` in seconds, or None for `never`."""
    try:
        return parse_lifetime(text)
    except InvalidArgument:
        raise Usage(f"bad --ttl {text!r}: expected <n>s|m|h|d or never") from None


def parse_limit(text: str) -> int | None:
    """A queue limit: a whole number, or `none` (no limit); the range is the application's."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise Usage(f"bad limit {text!r}: expected a whole number or none") from None


def parse_delay_arg(text: str) -> float:
    try:
        return parse_delay(text).total_seconds()
    except InvalidArgument:
        raise Usage(f"bad --delay {text!r}: expected <n>s|m|h|d") from None


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


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


# -- output --------------------------------------------------------------------------------


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, document: Any, text: Callable[[Any], str] | None = None) -> None:
        if self.as_json:
            print(json.dumps(document, indent=2, sort_keys=False, default=str))
        else:
            print(text(document) if text else _pairs(document))


def _pairs(document: dict[str, Any]) -> str:
    lines = []
    for key, value in document.items():
        shown = (json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list))
                 else ("" if value is None else value))
        lines.append(f"{key}: {shown}")
    return "\n".join(lines)


TODO_COLUMNS = ("id", "queue", "state", "attempt", "owner", "created_at", "available_at", "title")
"""`todo list` text: `available_at` tells a delayed (or held: empty) pending todo from a claimable one."""


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    head = "  ".join(c.upper().ljust(w) for c, w in zip(columns, widths))
    return "\n".join([head] + ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells])


# -- commands ------------------------------------------------------------------------------


def _container(args: argparse.Namespace):
    from interfaces.bootstrap import build

    settings = Settings.from_env().with_overrides(database_url=args.database_url)
    if args.base_url is not None:
        settings = settings.with_overrides(base_url=args.base_url, base_url_explicit=True)
    container = build(settings)
    if not settings.base_url_explicit:  # mint URLs with the base URL `serve` recorded, if any
        recorded = container.app.recorded_base_url()
        if recorded is not None:
            container.app.base_url = recorded
    return container


def cmd_serve(args: argparse.Namespace, out: Output) -> int:
    from interfaces.http.server import serve

    settings = Settings.from_env().with_overrides(
        database_url=args.database_url, host=args.host, port=args.port, base_url=args.base_url,
        data_dir=args.data_dir,
    )
    if args.base_url is not None:
        settings = settings.with_overrides(base_url_explicit=True)
    if not settings.base_url_explicit:
        settings = settings.with_overrides(base_url=settings.listen_url())
    return serve(settings)


def _password_from_stdin(args) -> str | None:
    return sys.stdin.readline().rstrip("\r\n") if args.password_stdin else None


def cmd_operator_create(args, out: Output) -> int:
    password = _password_from_stdin(args)
    return _act(args, out, lambda c: c.app.create_operator(args.name, password, caller=CLI),
        lambda r: f"operator {r['name']} created" + (f"\npassword: {r['password']}" if r["password"] else ""))


def cmd_operator_reset_password(args, out: Output) -> int:
    password = _password_from_stdin(args)
    return _act(args, out, lambda c: c.app.reset_password(args.name, password, caller=CLI),
        lambda r: f"password of operator {r['name']} reset" + (f"\npassword: {r['password']}" if r["password"] else ""))


def cmd_secrets_reseal(args, out: Output) -> int:
    from interfaces.crypto import AesGcmSecretBox
    from interfaces.settings import check_secret_key

    old = os.environ.get("SWITCHBOARD_SECRET_KEY_OLD")
    if not old:
        raise ConfigurationError("set SWITCHBOARD_SECRET_KEY_OLD to the key the secrets were sealed with")
    old_box = AesGcmSecretBox(check_secret_key(old, "SWITCHBOARD_SECRET_KEY_OLD"))
    return _act(args, out, lambda c: c.webhooks.reseal(old_box, caller=CLI),
        lambda r: f"re-sealed {r['resealed']} webhook secret(s) under the current key;"
                  f" {r['already_current']} already were")


def cmd_operator_token(args, out: Output) -> int:
    return _act(args, out, lambda c: c.app.mint_operator_token(args.name, caller=CLI),
        lambda r: f"token: {r['token']}\n(shown once: store it now)")


def cmd_endpoint_vend(args, out: Output) -> int:
    ttl_seconds = parse_ttl(args.ttl)  # a usage error before the store is touched
    with _closing(_container(args)) as c:
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
    with _closing(_container(args)) as c:
        rows = c.app.list_endpoints(caller=CLI)
    out.emit({"endpoints": rows}, lambda d: _table(
        [r | {"queues": ",".join(r["queues"]), "state": "revoked" if r["revoked"] else "active"} for r in d["endpoints"]],
        ("slug", "endpoint_id", "owner", "queues", "state", "expires_at"),
    ))
    return EXIT_OK


def cmd_endpoint_revoke(args, out: Output) -> int:
    return _act(args, out, lambda c: c.app.revoke(args.ref, caller=CLI),
        lambda r: f"endpoint {r['slug']} revoked; {r['released_leases']} lease(s) released")


def cmd_todo_push(args, out: Output) -> int:
    payload = parse_json_arg(args.payload, "payload") if args.payload is not None else None
    return _act(
        args, out,
        lambda c: c.app.push(args.endpoint, args.title, caller=CLI, queue=args.queue, payload=payload, key=args.key,
                             not_before=args.not_before,
                             delay_seconds=parse_delay_arg(args.delay) if args.delay is not None else None),
        lambda r: f"{r['todo']['id']} {'created' if r['created'] else 'exists'} on {r['todo']['queue']}"
                  + (f", claimable from {r['todo']['available_at']}" if args.not_before or args.delay else ""),
    )


def _more_hint(page: dict[str, Any], noun: str, argv: Sequence[str]) -> None:
    """A listing that has more rows than it showed says so, on stderr: how to get the rest."""
    cursor = page.get("next_cursor")
    if cursor is None:
        return
    kept = []
    skip = False
    for arg in argv:  # the same command again, with --cursor replaced
        if skip:
            skip = False
        elif arg == "--cursor":
            skip = True
        elif not arg.startswith("--cursor="):
            kept.append(arg)
    shown = " ".join(shlex.quote(a) for a in kept)
    print(f"more {noun} than the {len(page[noun])} shown; next page: switchboard {shown} --cursor {cursor}",
          file=sys.stderr)


def cmd_todo_list(args, out: Output) -> int:
    with _closing(_container(args)) as c:
        page = c.app.page_todos(caller=CLI, endpoint=args.endpoint, state=args.state, queue=args.queue,
                                limit=args.limit, cursor=args.cursor)
    out.emit(page, lambda d: _table(d["todos"], TODO_COLUMNS))
    if not out.as_json:
        _more_hint(page, "todos", args.argv)
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
    return _act(args, out, lambda c: c.app.get_todo(args.id, caller=CLI), lambda t: _pairs(_pruned_shown(t)))


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
    return _act(args, out, lambda c: c.retention.prune(age, caller=CLI, dry_run=args.dry_run, reclaim=args.reclaim),
                text)


def cmd_todo_retry(args, out: Output) -> int:
    if args.dead_letters or args.endpoint is not None:
        if args.id is not None or not (args.dead_letters and args.endpoint):
            raise Usage("retry either one todo (ID) or, with --endpoint E --dead-letters, its dead letters")
        return _act(args, out, lambda c: c.app.bulk_retry(args.endpoint, caller=CLI, dead_letters=True,
                                                          queue=args.queue, dry_run=args.dry_run),
                    lambda r: (f"would retry {r['would_retry']} dead letter(s)" if "would_retry" in r
                               else f"retried {r['retried']} dead letter(s) (bulk action {r['bulk_action_id']})"))
    if args.id is None or args.queue is not None or args.dry_run:
        raise Usage("retry either one todo (ID) or, with --endpoint E --dead-letters, its dead letters")
    return _act(args, out, lambda c: c.app.retry(args.id, caller=CLI),
        lambda r: f"{r['id']} {r['state']} (attempt {r['attempt']}/{r['max_attempts']})")


def cmd_todo_move(args, out: Output) -> int:
    return _act(args, out, lambda c: c.app.release_quarantined(args.id, args.queue, caller=CLI),
                lambda r: f"{r['id']} released from quarantine to {r['queue']}: {r['state']}")


def cmd_todo_discard(args, out: Output) -> int:
    return _act(args, out, lambda c: c.app.discard_quarantined(args.id, caller=CLI, summary=args.summary),
                lambda r: f"{r['id']} discarded: {r['state']}")


QUEUE_COLUMNS = ("queue", "paused", "max_in_flight", "max_claims_per_minute", "in_flight", "claims_last_minute")


def cmd_queue_list(args, out: Output) -> int:
    return _act(args, out, lambda c: c.app.queue_controls(args.endpoint, caller=CLI),
                lambda r: _table(r["queues"], QUEUE_COLUMNS))


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
    return _act(args, out, lambda c: c.app.set_queue_controls(args.endpoint, args.queue, caller=CLI, **changes),
                lambda r: _table([r], QUEUE_COLUMNS))


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
    with _closing(_container(args)) as c:
        history = c.app.history(args.id, caller=CLI)
    out.emit({"events": history["events"]}, _history_text)
    return EXIT_OK


def _explain_text(d: dict[str, Any]) -> str:
    """The because first, then the story, one sentence a line with its time."""
    return "\n".join([d["because"], ""] + [f"{s['time']}  {s['text']}" for s in d["story"]])


def cmd_todo_explain(args, out: Output) -> int:
    with _closing(_container(args)) as c:
        explained = c.app.explain(args.id, caller=CLI)
    out.emit(explained, _explain_text)
    return EXIT_OK


def cmd_projections_rebuild(args, out: Output) -> int:
    with _closing(_container(args)) as c:
        if args.verify:
            differences = c.projector.verify()
            report = {
                "verified": not differences,
                "differences": [
                    {"projection": d.projection, "table": d.table, "missing": [list(r) for r in d.missing],
                     "unexpected": [list(r) for r in d.unexpected]}
                    for d in differences
                ],
            }
            out.emit(report, lambda r: "read models match the event log" if r["verified"] else "\n".join(
                f"{d['projection']}.{d['table']}: {len(d['missing'])} missing, {len(d['unexpected'])} unexpected row(s)"
                for d in r["differences"]
            ))
            return EXIT_OK if not differences else EXIT_REFUSED
        counts = c.projector.rebuild()
    out.emit({"rebuilt": counts}, lambda r: "\n".join(f"{k}: {v} events replayed" for k, v in r["rebuilt"].items()))
    return EXIT_OK


def cmd_audit_export(args, out: Output) -> int:
    with _closing(_container(args)) as c:
        try:
            for record in c.audit.export(after=args.after, payloads=args.payloads):
                sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        except Break as broken:  # an event that cannot be read: the lines before it are out
            print(f"error: chain_broken: {broken}", file=sys.stderr)
            return EXIT_REFUSED
    return EXIT_OK


def cmd_audit_head(args, out: Output) -> int:
    with _closing(_container(args)) as c:
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
            with _closing(_container(args)) as c:
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


def cmd_webhook_create(args, out: Output) -> int:
    return _act(args, out, lambda c: c.webhooks.create(
        caller=CLI, endpoint=args.endpoint, source_type=args.source, target_queue=args.queue))


def cmd_webhook_list(args, out: Output) -> int:
    columns = ("webhook_id", "endpoint_id", "source_type", "target_queue", "trust_mode", "routes",
               "trusted_senders", "trusted_associations", "created_at")
    def shown(row: dict[str, Any]) -> dict[str, Any]:
        return {k: ",".join(v) if isinstance(v, list) else v for k, v in row.items()}

    return _act(args, out, lambda c: c.webhooks.list(caller=CLI, endpoint=args.endpoint),
                lambda d: _table([shown(r) for r in d["webhooks"]], columns))


def cmd_webhook_rotate(args, out: Output) -> int:
    return _act(args, out, lambda c: c.webhooks.rotate(args.id, caller=CLI))


def cmd_webhook_delete(args, out: Output) -> int:
    return _act(args, out, lambda c: c.webhooks.delete(args.id, caller=CLI),
        lambda r: f"webhook {r['webhook_id']} deleted")


def cmd_webhook_trust(args, out: Output) -> int:
    if args.clear == bool(args.sender or args.association):
        raise Usage("give --sender and/or --association, or --clear alone")
    return _act(args, out, lambda c: c.webhooks.set_trust(
        args.webhook, caller=CLI, senders=args.sender, associations=args.association),
        lambda r: f"webhook {r['webhook_id']} trusts "
                  + (", ".join([*r["trusted_senders"], *r["trusted_associations"]]) or "every sender"))


def _rules_text(r: dict[str, Any]) -> str:
    return json.dumps({k: r[k] for k in ("rules", "default_action", "params")}, indent=2)


def cmd_rules_get(args, out: Output) -> int:
    return _act(args, out, lambda c: c.webhooks.rules(args.webhook, caller=CLI), _rules_text)


def cmd_rules_set(args, out: Output) -> int:
    document = read_json_file(args.file, "rules")
    return _act(args, out, lambda c: c.webhooks.set_rules(args.webhook, document, caller=CLI), _rules_text)


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
    return _act(
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
    return _act(args, out, lambda c: c.webhooks.replay(args.webhook, candidate, caller=CLI, last=args.last),
                _replay_text)


def cmd_events_list(args, out: Output) -> int:
    columns = ("id", "delivery_id", "webhook_id", "source", "kind", "trust_mode", "verified", "disposition",
               "todos_created", "received_at")
    with _closing(_container(args)) as c:
        page = c.webhooks.list_events(caller=CLI, webhook_id=args.webhook, limit=args.limit, max_limit=1000,
                                      cursor=args.cursor)
    out.emit(page, lambda d: _table(d["events"], columns))
    if not out.as_json:
        _more_hint(page, "events", args.argv)
    return EXIT_OK


def _event_text(event: dict[str, Any]) -> str:
    """The delivery's facts, its headers one per line, then its body as received."""
    facts = {k: v for k, v in event.items() if k not in ("headers", "payload", "body")}
    lines = [_pairs(facts), "headers:"]
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
    return _act(args, out, lambda c: c.webhooks.get_event(args.id, caller=CLI, raw_body=not out.as_json), _event_text)


def _act(args, out: Output, call: Callable[[Any], Any], text: Callable[[Any], str] | None = None) -> int:
    """Builds the container, runs one application call, prints its answer."""
    with _closing(_container(args)) as c:
        result = call(c)
    out.emit(result, text)
    return EXIT_OK


class _closing:
    def __init__(self, container) -> None:
        self.container = container

    def __enter__(self):
        return self.container

    def __exit__(self, *exc) -> None:
        self.container.close()


# -- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", default=argparse.SUPPRESS,
                        help="sqlite:///PATH or postgresql://user[:pw]@host[:port]/db (default: $SWITCHBOARD_DATABASE_URL)")
    common.add_argument("--base-url", default=argparse.SUPPRESS,
                        help="prefix of minted MCP and ingest URLs (default: $SWITCHBOARD_BASE_URL, else the one"
                             " serve recorded in the store, else http://127.0.0.1:8080)")
    parser = _Parser(prog="switchboard", description="Webhooks in, durable leased todos out, for AI agents.",
                     parents=[common])
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    groups = parser.add_subparsers(dest="group", required=True, parser_class=_Parser)

    def command(sub, name: str, func, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    serve = command(groups, "serve", cmd_serve, "serve HTTP (board, API, ingest, MCP, metrics) and background work")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir")

    operator = groups.add_parser("operator", help="operators").add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = command(operator, "create", cmd_operator_create, "create an operator (prints a generated password)")
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    p = command(operator, "token", cmd_operator_token, "mint an operator API token sbo_… (shown once)")
    p.add_argument("name")
    p = command(operator, "reset-password", cmd_operator_reset_password,
                "set a new password (prints a generated one once)")
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")

    secrets_group = groups.add_parser("secrets", help="webhook signing secrets at rest").add_subparsers(
        dest="action", required=True, parser_class=_Parser)
    command(secrets_group, "reseal", cmd_secrets_reseal,
            "re-seal every signing secret under SWITCHBOARD_SECRET_KEY (SWITCHBOARD_SECRET_KEY_OLD opens them)")

    endpoint = groups.add_parser("endpoint", help="agent endpoints").add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = command(endpoint, "vend", cmd_endpoint_vend, "vend an endpoint (the credential is shown once)")
    p.add_argument("agent")
    p.add_argument("--queue", action="append", required=True)
    p.add_argument("--verbs")
    p.add_argument("--webhook-max", type=int)
    p.add_argument("--source-types")
    p.add_argument("--webhook-queue", action="append")
    p.add_argument("--ttl", default="never")
    p.add_argument("--default-lease", type=int)
    p.add_argument("--owner")
    command(endpoint, "list", cmd_endpoint_list, "list endpoints")
    p = command(endpoint, "revoke", cmd_endpoint_revoke, "revoke an endpoint at once")
    p.add_argument("ref", metavar="SLUG_OR_ID")

    todo = groups.add_parser("todo", help="todos").add_subparsers(dest="action", required=True, parser_class=_Parser)
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

    queue = groups.add_parser("queue", help="queue controls").add_subparsers(dest="action", required=True, parser_class=_Parser)
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

    webhook = groups.add_parser("webhook", help="webhooks").add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = command(webhook, "create", cmd_webhook_create, "create a webhook (the URL and signing secret are shown once)")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--source", required=True, metavar="TYPE")
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

    rules = groups.add_parser("rules", help="routing rules").add_subparsers(dest="action", required=True, parser_class=_Parser)
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

    events = groups.add_parser("events", help="stored deliveries").add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = command(events, "list", cmd_events_list, "stored deliveries, newest first")
    p.add_argument("--webhook")
    p.add_argument("--limit", type=int, default=50, help="rows per page, 1..1000 (default 50)")
    p.add_argument("--cursor", help="continue after a previous page (its next_cursor)")
    command(events, "show", cmd_events_show, "one delivery with redacted headers").add_argument("id")

    projections = groups.add_parser("projections", help="read models").add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = command(projections, "rebuild", cmd_projections_rebuild, "rebuild every read model from the event log")
    p.add_argument("--verify", action="store_true", help="compare a rebuild with the live read models (read-only)")

    retention = groups.add_parser("retention", help="stored payloads of finished work").add_subparsers(
        dest="action", required=True, parser_class=_Parser)
    p = command(retention, "prune", cmd_retention_prune,
                "remove the stored bodies, payloads and results of work finished longer ago than --older-than")
    p.add_argument("--older-than", required=True, metavar="AGE", help="<n>s|m|h|d, e.g. 30d")
    p.add_argument("--dry-run", action="store_true", help="count what would go, remove nothing")
    p.add_argument("--reclaim", action="store_true",
                   help="PostgreSQL: VACUUM FULL the payload store afterwards, giving the freed space back to the"
                        " system; it locks the payload store (ingest, pushes, payload reads wait) while it runs."
                        " SQLite: VACUUM and checkpoint even when nothing is left to prune")

    audit = groups.add_parser("audit", help="the event log").add_subparsers(dest="action", required=True, parser_class=_Parser)
    p = command(audit, "export", cmd_audit_export, "the event log as JSON lines, each with its prev_hash and hash")
    p.add_argument("--after", type=int, default=0, metavar="POSITION")
    p.add_argument("--payloads", action="store_true",
                   help="each line also carries the stored payloads its digests name (pruned ones absent)")
    p = command(audit, "verify", cmd_audit_verify,
                "re-compute the hash chain over the store, or over an export file (exit 1 names the first bad position)")
    p.add_argument("--file", metavar="EXPORT", help="an `audit export` file (`-`: stdin); the store is not opened")
    command(audit, "head", cmd_audit_head, "the last sealed link of the chain: {position, hash, time}")
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
