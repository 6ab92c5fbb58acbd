"""One transaction's statements in one libpq pipeline, sent through psycopg's `pq` layer directly.

psycopg's cursor in pipeline mode spends ~14 µs of Python per statement (cursor state, a send and
a receive attempt per `execute`, result bookkeeping; measured): an append sends ~14 statements,
and on the writer thread that Python is in the path of every commit. Here each statement's
placeholders are converted once, its parameters are dumped by psycopg's own `Transformer` (the
same adaptation `cursor.execute` does), it is sent prepared from its second use on (and handed
to the socket at once, so the server runs it while the next is prepared), and the results are
read once, after the one Sync: ~3 µs per statement (docs/adr/0023).

The connection must be used for nothing else while a pipeline runs, and must be discarded after
any error: a statement prepared in a pipeline that aborted was never prepared on the server.
"""

from __future__ import annotations

import functools
import re
import select
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.errors import error_from_result

PREPARED_MAX = 256
"""Statements prepared per connection at most; beyond, a new one is sent unnamed (parsed per use)."""
SEEN_MAX = 4 * PREPARED_MAX
"""Statements remembered as sent once (the next use prepares them) at most per connection."""

Statement = tuple[str | bytes, Sequence[Any] | None, bool]
"""(SQL with %s / %b placeholders, its parameters or None, whether its rows come back binary)."""

_PLACEHOLDER = re.compile(rb"%(.)")
_FORMATS = {b"s": PyFormat.AUTO, b"b": PyFormat.BINARY, b"t": PyFormat.TEXT}


@functools.lru_cache(maxsize=1024)
def convert(sql: bytes) -> tuple[bytes, tuple[PyFormat, ...]]:
    """`%s`/`%b`/`%t` placeholders to `$1…$n` with the format each asks for (`%%` is a `%`)."""
    formats: list[PyFormat] = []

    def number(match: re.Match) -> bytes:
        kind = match.group(1)
        if kind == b"%":
            return b"%"
        if kind not in _FORMATS:
            raise ValueError(f"unsupported placeholder %{kind.decode()} in {sql[:80]!r}")
        formats.append(_FORMATS[kind])
        return b"$%d" % len(formats)

    return _PLACEHOLDER.sub(number, sql), tuple(formats)


class Pipeline:
    """Runs whole transactions on one autocommit connection, one round trip each."""

    def __init__(self, conn: psycopg.Connection, prefix: bytes = b"sb_") -> None:
        """`prefix`: of the statements it prepares (two pipelines on one connection need two)."""
        self.connection = conn
        self._prefix = prefix
        self._pgconn = conn.pgconn
        self._tx = Transformer(conn)
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._seen: set[tuple[bytes, tuple[int, ...]]] = set()

    def run(self, statements: Sequence[Statement]) -> list[pq.PGresult]:
        """Sends the statements and a Sync, then reads every result: one per statement, in order.
        Raises the first statement's error (as psycopg would), or `OperationalError` if the
        connection is lost."""
        owners = self._send(statements, eager=True)
        return self._answers(owners, len(statements), self._communicate())

    def start(self, statements: Sequence[Statement]) -> Sent:
        """Queues the statements and a Sync and returns at once, on a connection in non-blocking
        mode: a caller on an event loop hands the rest to the socket when it is writable
        (`Sent.flush`) and reads the results when it is readable (`Sent.poll`). Nothing here
        waits, even for a server that reads nothing while its session waits for a lock."""
        if not self._pgconn.nonblocking:
            raise ValueError("Pipeline.start needs a connection in non-blocking mode")
        owners = self._send(statements, eager=False)
        return Sent(self, owners, len(statements))

    def _send(self, statements: Sequence[Statement], *, eager: bool) -> list[int]:
        """Queues the statements and a Sync. `eager`: each statement is handed to the socket as it
        is queued, so the server runs it while the next is prepared (a writer thread waiting for
        the answer gains that time); else only the first (BEGIN and the lock start at once) and
        the rest as the caller flushes, or as libpq's buffer fills (an event loop, whose CPU is
        the bottleneck, saves a send per statement: ingest +2 % in 10 of 14 alternated pairs, while
        claims on the writer thread measured 5-9 % slower that way; docs/adr/0023)."""
        pgconn = self._pgconn
        pgconn.enter_pipeline_mode()
        owners: list[int] = []  # the statement each result belongs to (-1: a Prepare)
        for index, (sql, args, binary) in enumerate(statements):
            query, formats = convert(sql if isinstance(sql, bytes) else sql.encode())
            result_format = pq.Format.BINARY if binary else pq.Format.TEXT
            if formats:
                params = self._tx.dump_sequence(args or (), formats)
                types, param_formats = tuple(self._tx.types), list(self._tx.formats)
            else:
                params, types, param_formats = None, (), None
            key = (query, types)
            name = self._prepared.get(key)
            if name is None and key in self._seen and len(self._prepared) < PREPARED_MAX:
                name = self._prepared[key] = b"%s%d" % (self._prefix, len(self._prepared))
                pgconn.send_prepare(name, query, param_types=types or None)
                owners.append(-1)
            if len(self._seen) < SEEN_MAX:
                self._seen.add(key)
            if name is None:
                pgconn.send_query_params(query, params, param_types=types or None, param_formats=param_formats,
                                         result_format=result_format)
            else:
                pgconn.send_query_prepared(name, params, param_formats=param_formats, result_format=result_format)
            owners.append(index)
            if eager or index == 0:
                pgconn.flush()  # without waiting
        pgconn.pipeline_sync()
        return owners

    def _answers(self, owners: list[int], count: int, results: list[pq.PGresult]) -> list[pq.PGresult]:
        self._pgconn.exit_pipeline_mode()
        answers: list[pq.PGresult] = []
        error: pq.PGresult | None = None
        for owner, result in zip(owners, results):
            if result.status == pq.ExecStatus.FATAL_ERROR and error is None:
                error = result
            if owner >= 0:
                answers.append(result)
        if error is not None:
            raise error_from_result(error, encoding=self.connection.info.encoding)
        if len(answers) != count:
            raise psycopg.OperationalError(f"{len(answers)} results for {count} statements")
        return answers

    def rows(self, result: pq.PGresult) -> list[tuple]:
        """The rows of a result, loaded as psycopg loads them."""
        self._tx.set_pgresult(result)
        return self._tx.load_rows(0, result.ntuples, tuple)

    def _communicate(self) -> list[pq.PGresult]:
        """Flushes what is queued and reads results up to the Sync's; while the output is not all
        sent, input is read too (the server may be blocked sending us results)."""
        pgconn, fd = self._pgconn, self._pgconn.socket
        self._flush()
        results: list[pq.PGresult] = []
        while True:
            while pgconn.is_busy():
                select.select([fd], [], [])
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                return results
            results.append(result)

    def _flush(self) -> None:
        """Hands everything queued to the socket (reading meanwhile: the server may be blocked
        sending us results)."""
        pgconn, fd = self._pgconn, self._pgconn.socket
        while pgconn.flush():
            readable, _, _ = select.select([fd], [fd], [])
            if readable:
                pgconn.consume_input()


class Sent:
    """A transaction sent by `Pipeline.start`, its results read as they come, without blocking."""

    def __init__(self, pipeline: Pipeline, owners: list[int], count: int) -> None:
        self.pipeline = pipeline
        self.socket = pipeline._pgconn.socket
        self._owners = owners
        self._count = count
        self._results: list[pq.PGresult] = []

    def flush(self) -> bool:
        """Hands what it can to the socket without waiting; True once all has gone."""
        return self.pipeline._pgconn.flush() == 0

    def poll(self) -> list[pq.PGresult] | None:
        """Reads what has come: every statement's result once the Sync's has (as `Pipeline.run`
        returns them, or its error raised), else None. `OperationalError` if the connection is lost."""
        pgconn = self.pipeline._pgconn
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                continue  # the end of one statement's results
            if result.status == pq.ExecStatus.PIPELINE_SYNC:
                return self.pipeline._answers(self._owners, self._count, self._results)
            self._results.append(result)
        return None
