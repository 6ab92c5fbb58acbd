"""Read-model ops (`(sql, params)`) as they reach a cursor: run in order, one executemany per run
of one statement (`run_ops`), or on PostgreSQL coalesced into fewer statements first
(`coalesce_ops`, docs/adr/0023); text NUL-free on every store (`storable`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any


def storable(params: Sequence[Any]) -> tuple[Any, ...]:
    """PostgreSQL text cannot hold NUL; replaced the same way on every store (rebuild equals live)."""
    for p in params:  # the usual case, no NUL anywhere: the parameters as they are (a writer batch has hundreds)
        if isinstance(p, str) and "\x00" in p:
            return tuple(p.replace("\x00", "\ufffd") if isinstance(p, str) else p for p in params)
    return params if type(params) is tuple else tuple(params)


def run_ops(cursor: Any, ops: Sequence[tuple[str, Sequence[Any]]], placeholder: str) -> None:
    """Runs projection ops on any DB-API cursor; consecutive identical statements go as one executemany.

    Read models are derived data: a value no store can hold must never stop a projection.
    """
    i = 0
    while i < len(ops):
        sql = ops[i][0]
        j = i
        while j < len(ops) and ops[j][0] == sql:
            j += 1
        statement = sql if placeholder == "%s" else sql.replace("%s", placeholder)
        if j - i == 1:
            cursor.execute(statement, storable(ops[i][1]))
        else:
            cursor.executemany(statement, [storable(op[1]) for op in ops[i:j]])
        i = j


_KEYED_WHERE = re.compile(r"(?:UPDATE (\w+) SET (.*)|DELETE FROM (\w+)) WHERE (\w+) = %s")
_KEYED_UPSERT = re.compile(
    r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES (\((?:%s|\d+)(?:, (?:%s|\d+))*\))"
    r" ON CONFLICT \(([\w, ]+)\) DO (?:UPDATE SET (.*)|NOTHING)")
_KEYED_INSERT = re.compile(r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES (\((?:%s|\d+)(?:, (?:%s|\d+))*\))")
_ADDITIVE = re.compile(r"(\w+) = (\w+)\.\1 \+ excluded\.\1")

RowShape = tuple[str, str, str, "int | tuple[int, ...]", "int | None"]
"""(kind, table, key column(s), index or indexes of the key parameter(s), index of the increment)."""


def _row_key_shape(sql: str) -> RowShape | None:
    """How a single-row op names its row: (kind, table, key column(s), index or indexes of the key
    parameter(s), index of the increment of an additive upsert), or None when it cannot be told from
    the statement (then the op is never moved or merged).

    Recognised: `UPDATE t SET ... WHERE col = %s`, `DELETE FROM t WHERE col = %s` (the key the
    last parameter), `INSERT INTO t (cols) VALUES (%s, 1, ...) ON CONFLICT (col, ...) DO UPDATE SET ...`
    (the key the parameters of the conflict columns) or `... DO NOTHING` (`nothing`), and a plain
    `INSERT INTO t (col, ...) VALUES (%s, ...)` whose values are parameters or integers (the key its
    first column, the one our inline tables are keyed by); none with a sub-select, none that
    assigns its key column. An upsert whose only assignment is `c = t.c + excluded.c` is `add`:
    its ops on one row add up (`coalesce_ops` sums their increments).
    """
    if "SELECT" in sql:
        return None
    count = sql.count("%s")
    where = _KEYED_WHERE.fullmatch(sql)
    if where is not None:
        table, assigned, deleted, column = where.groups()
        if assigned is not None and re.search(rf"\b{column}\b", assigned):
            return None
        return ("update" if deleted is None else "delete"), table or deleted, column, count - 1, None
    upsert = _KEYED_UPSERT.fullmatch(sql)
    if upsert is not None:
        table, columns, values, conflict, assigned = upsert.groups()
        names = [c.strip() for c in columns.split(",")]
        keys = [c.strip() for c in conflict.split(",")]
        given = [v.strip() == "%s" for v in values[1:-1].split(",")]
        if len(names) != len(given) or count != sum(given):
            return None
        param = {name: given[:i].count(True) for i, name in enumerate(names) if given[i]}  # column -> its parameter
        if not all(k in param for k in keys):
            return None
        at = param[keys[0]] if len(keys) == 1 else tuple(param[k] for k in keys)
        if assigned is None:
            return "nothing", table, conflict, at, None
        if any(re.search(rf"\b{k}\s*=", assigned) for k in keys):
            return None
        additive = _ADDITIVE.fullmatch(assigned)
        if additive is not None and additive.group(2) == table and additive.group(1) in param \
                and additive.group(1) not in keys:
            return "add", table, conflict, at, param[additive.group(1)]
        return "upsert", table, conflict, at, None
    insert = _KEYED_INSERT.fullmatch(sql)
    if insert is not None:
        table, columns, values = insert.groups()
        names = [c.strip() for c in columns.split(",")]
        if len(names) == len(values.split(",")) and values.startswith("(%s"):
            return "insert", table, names[0], 0, None
    return None


@functools.lru_cache(maxsize=1024)
def _shape_of(sql: str) -> tuple[RowShape, int] | None:
    """A statement's `_row_key_shape` and its placeholder count, once (a batch names a few
    statements hundreds of times)."""
    shape = _row_key_shape(sql)
    return None if shape is None else (shape, sql.count("%s"))


def _keyed(sql: str, params: Sequence[Any]) -> tuple[RowShape, Any] | None:
    """The shape of a single-row op (`_row_key_shape`) and the key value of its row, or None."""
    found = _shape_of(sql)
    if found is None or found[1] != len(params):
        return None
    shape = found[0]
    at = shape[3]
    return shape, (params[at] if isinstance(at, int) else tuple(params[i] for i in at))


_PLAIN_ITEMS = re.compile(r"[A-Za-z0-9_.:-]+(?:,[A-Za-z0-9_.:-]+)*")


def array_param(values: list[Any]) -> Any:
    """An `= ANY(%s)` parameter: text items that need no quoting (ids, as the keys of our inline
    tables are) as the array's literal `{a,b}`, which psycopg sends as it is (it dumps a list
    item by item in Python, a regular expression each: ~4x the time); anything else, the list.
    Either is a parameter of unknown type, which the server reads as an array of the column's type."""
    if all(type(v) is str for v in values):
        joined = ",".join(values)
        if joined.count(",") == len(values) - 1 and _PLAIN_ITEMS.fullmatch(joined) and "null" not in joined.lower():
            return "{" + joined + "}"
    return values


_UNKEYED = object()
_WHOLE_ROW = frozenset({"upsert", "add", "nothing", "insert"})
"""Kinds whose ops of one statement merge into one multi-row VALUES whatever their parameters."""


def coalesce_ops(ops: Sequence[tuple[str, Sequence[Any]]]) -> list[tuple[str, tuple[Any, ...]]]:
    """PostgreSQL: the same ops in fewer statements (a writer batch's inline ops are ~3 per event,
    a catch-up page's ~4).

    Within a stretch of single-row ops (`_keyed`) that name distinct rows — per table one key
    (column or columns), each key value once — the ops touch disjoint rows, so their order does
    not matter: the UPDATEs or DELETEs of one statement with the same other parameters become one
    `col = ANY(%s)`, and the inserts or upserts of one statement one multi-row VALUES. A row may be
    named again in its stretch only by the very statement that named it first when that statement
    is an additive upsert (`add`: the increments are summed into one row, as adding commutes) or
    `ON CONFLICT ... DO NOTHING` with the same parameters (the repeat does nothing, and is left
    out). Any other op, and any other second naming of a row, ends the stretch; nothing moves
    across it. NUL in text is replaced first (`storable`), as `run_ops` does.
    """
    out: list[tuple[str, tuple[Any, ...]]] = []
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    sqls: dict[tuple[Any, ...], tuple[str, RowShape]] = {}
    columns: dict[str, str] = {}
    rows: dict[tuple[str, Any], tuple[str, tuple[Any, ...], int]] = {}
    """Each row named in the stretch: the statement and parameters that named it, and where its
    member sits in that statement's group."""

    def flush() -> None:
        for group, members in groups.items():
            sql, (kind, _, column, _, _) = sqls[group]
            if len(members) == 1:
                out.append((sql, members[0]))
            elif kind in ("upsert", "add", "nothing"):
                head, values, tail = sql.partition(" VALUES ")[0], _KEYED_UPSERT.fullmatch(sql).group(3), \
                    sql.partition(" ON CONFLICT ")[2]
                out.append((f"{head} VALUES {', '.join([values] * len(members))} ON CONFLICT {tail}",
                            tuple(p for m in members for p in m)))
            elif kind == "insert":
                head, values = sql.partition(" VALUES ")[0], _KEYED_INSERT.fullmatch(sql).group(3)
                out.append((f"{head} VALUES {', '.join([values] * len(members))}", tuple(p for m in members for p in m)))
            else:
                prefix = sql[: -len(f"{column} = %s")]
                out.append((f"{prefix}{column} = ANY(%s)", (*members[0][:-1], array_param([m[-1] for m in members]))))
        groups.clear()
        sqls.clear()
        columns.clear()
        rows.clear()

    for sql, raw in ops:
        params = storable(raw)
        keyed = _keyed(sql, params)
        if keyed is None:
            flush()
            out.append((sql, params))
            continue
        shape, key = keyed
        kind, table, column, _, increment = shape
        try:
            named = rows.get((table, key)) if key is not None else _UNKEYED
        except TypeError:  # an unhashable key: no row we can tell apart
            named = _UNKEYED
        if named is _UNKEYED:  # no row named, or none we can tell apart
            flush()
            out.append((sql, params))
            continue
        if named is not None and named[0] == sql:
            first_sql, first_params, at = named
            if kind == "nothing" and first_params == params:
                continue  # it does nothing: the row is there since the first
            if kind == "add" and isinstance(params[increment], int) and isinstance(first_params[increment], int) \
                    and first_params[:increment] + first_params[increment + 1:] == params[:increment] + params[increment + 1:]:
                members = groups[(sql,)]
                summed = list(members[at])
                summed[increment] += params[increment]
                members[at] = tuple(summed)
                rows[(table, key)] = (first_sql, members[at], at)
                continue
        if columns.get(table, column) != column or named is not None:
            flush()
        columns[table] = column
        group = (sql,) if kind in _WHOLE_ROW else (sql, *params[:-1])
        try:
            members = groups.get(group)
        except TypeError:  # an unhashable parameter (a JSON value): this op stays as it is
            group = (sql, id(params))
            members = None
        if members is None:
            members = groups[group] = []
            sqls[group] = (sql, shape)
        rows[(table, key)] = (sql, params, len(members))
        members.append(params)
    flush()
    return out

