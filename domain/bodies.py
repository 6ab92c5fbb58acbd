"""A delivery's body as a payload: strict JSON, GitHub's form mode, or text (CONTRACT §4, §11).

The payload is read once at ingest and again from its stored bytes (domain/payloads.py) by the
same rules, so a rule, a todo and a replay see the same value. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs

import msgspec

from domain.payloads import FORM, JSON, TEXT

_FORM = "application/x-www-form-urlencoded"
# where a lone surrogate in a parsed body comes from: a \uD800-\uDFFF escape, or a surrogate
# code point in the text (json reads bytes with "surrogatepass")
_SURROGATE_ESCAPE = re.compile("\\\\u[dD][89a-fA-F]")


def parse_payload(body: bytes, content_type: str | None) -> object | None:
    """A JSON body, or the JSON in a form body's `payload` field (GitHub's form mode); else None."""
    return parse_payload_form(body, content_type)[0]


def parse_payload_form(body: bytes, content_type: str | None) -> tuple[object | None, str]:
    """The payload and how it is read from the body again: "json" (the body is JSON), "form" (the
    JSON in a form body's `payload` field) or "text" (no JSON: the payload is None)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type == _FORM:
        try:
            fields = parse_qs(body.decode(), keep_blank_values=True)
        except ValueError:
            fields = {}
        if "payload" in fields:
            value = strict_json(fields["payload"][0])
            return value, TEXT if value is None else FORM
    value = strict_json(body)
    return value, TEXT if value is None else JSON


def read_payload(data: bytes, form: str | None, content_type: str | None = None) -> object | None:
    """A payload from its stored bytes (domain/payloads.py): the JSON value, or for "text" the body
    as text (the payload of a todo whose delivery is not JSON). Form None: a delivery from before
    payloads were stored once, read as ingest read it."""
    if form == JSON:
        return json.loads(data)  # checked as strict JSON when it was stored
    if form == FORM:
        return parse_payload(data, _FORM)
    if form == TEXT:
        return data.decode(errors="replace")
    return parse_payload(data, content_type)


def strict_json(text: bytes | str) -> object | None:
    """Strict JSON (no NaN or Infinity, no lone surrogates), or None for anything else, however odd."""
    try:
        # msgspec first (~2x faster): where it takes a document at all, it gives what json.loads
        # gives; it refuses more (a BOM, UTF-16, any surrogate, 1e400), and those go the long way
        return msgspec.json.decode(text)
    except (msgspec.MsgspecError, UnicodeError, RecursionError):
        pass
    try:
        if isinstance(text, bytes):  # as json.loads would decode it (UTF-8, -16 or -32)
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, TypeError, RecursionError):
        return None
    if _may_hold_surrogate(text) and not _is_unicode(value):
        return None  # `"\ud800"` parses, but is not text: it could be neither stored nor shown
    return value


def _may_hold_surrogate(text: str) -> bool:
    """Whether a text has a surrogate escape or code point (cheap tests first: one regex with a
    surrogate character class costs ~12 µs per KB of non-ASCII text, the tests here ~0.1)."""
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        return True
    if text.isascii():
        return False
    try:
        text.encode()  # UTF-8 refuses exactly the surrogate code points
    except UnicodeEncodeError:
        return True
    return False


def _is_unicode(value: object) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except (UnicodeEncodeError, ValueError, RecursionError):
        return False
    return True


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")
