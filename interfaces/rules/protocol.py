"""The wire protocol between `JqRuleEngine` (engine.py, handle.py, pool.py) and its rule workers (worker.py).

Both sides use this module and nothing else to speak to each other. It imports only the
standard library: the worker runs as ``python -I worker.py`` (no project directory on its path,
never the application) and loads this file by its path.

**Frames**, both ways over pipes: `FRAME` (``!II``: header length, blob length), the header as
compact JSON, then the blob (the envelopes of an eval request, one after another; replies have
none). Every request carries ``req`` (its number) and ``lens`` (the length of each envelope in
the blob); every reply carries back the ``req`` it answers.

=========  ==============================================  ======================================
op         request                                         reply
=========  ==============================================  ======================================
(start)    —                                               ``{"ready": true, "pid": n}``
compile    ``{"set": SET}``                                ``{"errors": [[rule, message], ...]}``
eval       ``{"sets": [SET | {"key"}], "modes": "PAB…",    ``{"results": [[OUTCOME | null per
           "budgets": [rule s, delivery s]}`` + blob       set], ...]}``, or ``{"need": true}``
ping       ``{}``                                          ``{"pong": true}``
=========  ==============================================  ======================================

SET is ``{"key", "exprs", "embedded", "params"}``; an eval may name a set the worker compiled
before by its ``key`` alone, and the worker answers ``need`` if it no longer holds it. A mode
per envelope: ``P`` every set, ``A`` the first, ``B`` the second. OUTCOME is ``["m", rule]``
(matched), ``["n"]`` (no match) or ``["f", rule | null, reason]`` (faulted).

**Progress**: a shared block of `PROGRESS_SIZE` bytes holding one `PROGRESS` record (request,
phase, item, set, rule, and since when the rule and the delivery ran), which the worker writes
before each step and the parent reads to compute deadlines.
"""

from __future__ import annotations

import json
import struct

FRAME = struct.Struct("!II")  # header length, blob length
PROGRESS = struct.Struct("<qqqqqdd")  # req, phase, item, set, rule, t_rule, t_delivery
PROGRESS_SIZE = 64
IDLE, COMPILE, EVAL = 0, 1, 2  # phases

MATCHED, NO_MATCH, FAULTED = "m", "n", "f"  # outcome tags

MODE_BOTH, SET_MODES = "P", "AB"


# -- frames -----------------------------------------------------------------------------------


def frame_head(header: dict, blob_size: int = 0) -> bytes:
    """A frame up to its blob: sizes and the JSON header (the blob is written after it)."""
    body = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(body), blob_size) + body


def frame_size(buffer: bytes | bytearray) -> int | None:
    """The size of the whole frame at the start of `buffer`, once its sizes have arrived."""
    if len(buffer) < FRAME.size:
        return None
    header_size, blob_size = FRAME.unpack_from(buffer)
    return FRAME.size + header_size + blob_size


def parse_header(raw: bytes) -> dict:
    """A frame's header; ValueError if it is not a JSON object."""
    header = json.loads(raw)
    if not isinstance(header, dict):
        raise ValueError("a frame's header must be a JSON object")
    return header


def read_frame(stream) -> tuple[dict, bytes] | None:
    """The next frame on a blocking binary stream, as (header, blob); None at its end."""
    sizes = _read_exact(stream, FRAME.size)
    if sizes is None:
        return None
    header_size, blob_size = FRAME.unpack(sizes)
    raw_header = _read_exact(stream, header_size)
    blob = _read_exact(stream, blob_size) if blob_size else b""
    if raw_header is None or blob is None:
        return None
    return parse_header(raw_header), blob


def _read_exact(stream, size: int) -> bytes | None:
    data = stream.read(size)
    if data is None or len(data) < size:
        return None
    return data


# -- messages ---------------------------------------------------------------------------------


def compile_request(rule_set: dict) -> dict:
    return {"op": "compile", "set": rule_set}


def eval_request(sets: list[dict], modes: str, budgets: list[float]) -> dict:
    return {"op": "eval", "sets": sets, "modes": modes, "budgets": budgets}


def ping_request() -> dict:
    return {"op": "ping"}


def ready_reply(pid: int) -> dict:
    return {"ready": True, "pid": pid}


def compile_reply(errors: list[list]) -> dict:
    return {"errors": errors}


def eval_reply(results: list[list]) -> dict:
    return {"results": results}


def need_reply() -> dict:
    return {"need": True}


def pong_reply() -> dict:
    return {"pong": True}


def matched(rule: int) -> list:
    return [MATCHED, rule]


def no_match() -> list:
    return [NO_MATCH]


def faulted(rule: int | None, reason: str) -> list:
    return [FAULTED, rule, reason]


def sets_of(mode: str, set_count: int) -> list[int]:
    """Which rule sets an envelope's mode asks for: P(air) all of them, A the first, B the second."""
    return list(range(set_count)) if mode == MODE_BOTH else [SET_MODES.index(mode)]
