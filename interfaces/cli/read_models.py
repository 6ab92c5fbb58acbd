"""`switchboard projections`: rebuilding the read models from the event log, or comparing a rebuild
with them."""

from __future__ import annotations

from interfaces.cli.arguments import AddCommand, Parser
from interfaces.cli.container import closing, open_container
from interfaces.cli.output import EXIT_OK, EXIT_REFUSED, Output


def cmd_projections_rebuild(args, out: Output) -> int:
    with closing(open_container(args)) as c:
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


# -- parser --------------------------------------------------------------------------------


def add_parsers(groups, command: AddCommand) -> None:
    projections = groups.add_parser("projections", help="read models").add_subparsers(dest="action", required=True, parser_class=Parser)
    p = command(projections, "rebuild", cmd_projections_rebuild, "rebuild every read model from the event log")
    p.add_argument("--verify", action="store_true", help="compare a rebuild with the live read models (read-only)")
