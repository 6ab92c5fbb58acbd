"""How deep a JSON text nests, found without parsing it: msgspec and the MCP SDK's pydantic
recurse once per level and end in RecursionError (a 500) near 1,000 levels, so `/api/v1` and MCP
refuse more than MAX_JSON_DEPTH levels before parsing (CONTRACT §12)."""

from __future__ import annotations

from itertools import accumulate

MAX_JSON_DEPTH = 128
TOO_DEEP = f"JSON body nested deeper than {MAX_JSON_DEPTH} levels"

_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")  # for depth, an object is an array
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DELTA = {ord("["): 1, ord("]"): -1}
_SHRINK_PASSES = 8


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text nests arrays/objects deeper than `limit` (brackets inside strings
    do not count). Linear and mostly C, about what parsing the body costs (docs/adr/0015)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    if b'"' in body:  # drop escaped backslashes, then escaped quotes; every other quote delimits a string
        body = b"".join(body.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[0::2])
    brackets = body.translate(_BRACKETS_ONLY, _NOT_BRACKETS)
    passes = 0  # each pass takes the innermost level of every nest away: wide bodies shrink fast
    while passes < _SHRINK_PASSES and brackets:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets, passes = shorter, passes + 1
    return passes + max(accumulate(map(_DELTA.__getitem__, brackets)), default=0) > limit
