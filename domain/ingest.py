"""Webhook ingest: the pure decisions about one delivery (CONTRACT §4 and §11).

Given the raw body, the lower-cased headers and the clock's `now`, these functions check the
signature, name the delivery (its id and kind), redact what is stored, parse the payload and
derive the todo's one-line title. Nothing here reads a clock, a database or the network.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from urllib.parse import parse_qs

import msgspec

from domain.errors import DomainError
from domain.names import REDACTED, SOURCE_TYPES  # noqa: F401 - part of the ingest vocabulary
from domain.payloads import FORM, JSON, TEXT
from domain.todo_fields import one_line_title

SIGNED_SOURCES = ("github", "gitea", "cairn")
CAIRN_WINDOW = timedelta(seconds=300)
SIGNING_SECRET_PREFIX = "whsec_"
SIGNING_SECRET_BYTES = 32
DELIVERY_ID_MAX_BYTES = 256
SIGNATURE_REFUSED = "signature verification failed"
REDACTED_HEADERS = frozenset({
    "x-hub-signature", "x-hub-signature-256", "x-gitea-signature", "x-gogs-signature",
    "x-cairn-signature", "authorization", "cookie", "set-cookie", "proxy-authorization",
})
SIGNATURE_HEADERS = frozenset({"x-hub-signature-256", "x-gitea-signature", "x-cairn-signature"})
DELIVERY_ID_HEADERS_FIRST = ("x-github-delivery", "x-gitea-delivery")
DELIVERY_ID_HEADERS_LAST = ("x-delivery-id", "webhook-id")
GENERIC_TITLE_FIELDS = ("title", "name", "summary", "message")
CAIRN_TITLE_FIELDS = ("subject", "name", "title")
NOT_JSON_PREVIEW_BYTES = 1024  # how much of a body that is not JSON is read for its title

_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)
_FORM = "application/x-www-form-urlencoded"
# where a lone surrogate in a parsed body comes from: a \uD800-\uDFFF escape, or a surrogate
# code point in the text (json reads bytes with "surrogatepass")
_SURROGATE_ESCAPE = re.compile("\\\\u[dD][89a-fA-F]")


class SignatureRefused(DomainError):
    """Raised when a signed source's delivery fails its check; the reply never says why."""

    code = "unauthorized"

    def __init__(self, reason: str) -> None:
        super().__init__(SIGNATURE_REFUSED)
        self.reason = reason  # for logs and tests only, never for the caller


# --- signing -------------------------------------------------------------------------------


def new_signing_secret(random_bytes: bytes) -> str:
    """A signing secret is `whsec_` and 64 lowercase hex digits of 32 random bytes."""
    if len(random_bytes) != SIGNING_SECRET_BYTES:
        raise ValueError(f"a signing secret needs {SIGNING_SECRET_BYTES} random bytes")
    return SIGNING_SECRET_PREFIX + random_bytes.hex()


def check_single_signatures(source_type: str, header_names: Iterable[str]) -> None:
    """A signed delivery carries each signature header at most once: with two, which one was
    checked would depend on the parser (and an attacker could add a second)."""
    if source_type not in SIGNED_SOURCES:
        return
    seen: set[str] = set()
    for name in header_names:
        name = name.lower()
        if name in SIGNATURE_HEADERS:
            if name in seen:
                raise SignatureRefused(f"{name} sent more than once")
            seen.add(name)


def verify_signature(
    source_type: str, secret: str | None, headers: Mapping[str, str], body: bytes, now: datetime
) -> dict | None:
    """HMAC-SHA256 of the raw body, keyed by the secret exactly as shown; cairn also checks freshness.

    Returns the parsed cairn body for `cairn`, else None; `generic` is not checked at all.
    """
    if source_type == "generic":
        return None
    if source_type not in SIGNED_SOURCES:
        raise SignatureRefused(f"unknown source type {source_type!r}")
    if not secret:
        raise SignatureRefused("the webhook has no signing secret")
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    if source_type == "github":
        _check_hex(_prefixed(headers, "x-hub-signature-256"), expected)
        return None
    if source_type == "gitea":
        plain = headers.get("x-gitea-signature", "").strip()
        _check_hex(plain or _prefixed(headers, "x-hub-signature-256"), expected)
        return None
    _check_hex(_prefixed(headers, "x-cairn-signature"), expected)
    return _check_cairn_body(headers, body, now)


def _prefixed(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise SignatureRefused(f"missing {name}")
    if not value.startswith("sha256="):
        raise SignatureRefused(f"{name} lacks the sha256= prefix")
    return value.removeprefix("sha256=")


def _check_hex(given: str, expected: str) -> None:
    if not _HEX_SHA256.fullmatch(given):
        raise SignatureRefused("the signature is not 64 hex digits")
    if not hmac.compare_digest(given.lower(), expected):
        raise SignatureRefused("the signature does not match the body")


def _check_cairn_body(headers: Mapping[str, str], body: bytes, now: datetime) -> dict:
    parsed = _json(body)
    if not isinstance(parsed, dict):
        raise SignatureRefused("a cairn body must be a JSON object")
    event_id = parsed.get("event_id")
    if not isinstance(event_id, str) or not event_id.strip() or "\x00" in event_id:
        raise SignatureRefused("a cairn body needs a non-empty string event_id (without NUL)")
    created_at = _rfc3339(parsed.get("created_at"))
    if created_at is None:
        raise SignatureRefused("a cairn body needs created_at as an RFC 3339 time")
    if abs(now - created_at) > CAIRN_WINDOW:
        raise SignatureRefused(f"cairn created_at {created_at.isoformat()} is outside ±300 s of now")
    header_id = headers.get("x-cairn-event-id")
    if header_id is not None and header_id != event_id:
        raise SignatureRefused("x-cairn-event-id does not match the body's event_id")
    return parsed


def _rfc3339(value: object) -> datetime | None:
    if not isinstance(value, str) or not _RFC3339.fullmatch(value):
        return None
    try:
        return datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:  # a leap second, month 13, ...
        return None


def trust_of(source_type: str) -> tuple[str, bool]:
    """Signed sources are `signed` and verified; anything else trusts only the URL's token."""
    return ("signed", True) if source_type in SIGNED_SOURCES else ("token", False)


# --- naming the delivery -------------------------------------------------------------------


def delivery_id(
    headers: Mapping[str, str], source_type: str, cairn_body: dict | None, body: bytes
) -> str:
    """The first present sender id of at most 256 bytes, else `sha256:` and the body's hash."""
    from_cairn = source_type == "cairn" and isinstance(cairn_body, dict)
    cairn_id = cairn_body.get("event_id") if from_cairn else None
    candidates = (
        *(headers.get(name) for name in DELIVERY_ID_HEADERS_FIRST),
        cairn_id,
        *(headers.get(name) for name in DELIVERY_ID_HEADERS_LAST),
    )
    for candidate in candidates:
        if (
            isinstance(candidate, str) and candidate.strip() and "\x00" not in candidate
            and len(candidate.encode(errors="replace")) <= DELIVERY_ID_MAX_BYTES
        ):
            return candidate
    return "sha256:" + hashlib.sha256(body).hexdigest()


def delivery_kind(headers: Mapping[str, str], cairn_body: dict | None) -> str | None:
    """`X-GitHub-Event`, else `X-Gitea-Event`, else the cairn body's `kind`, else None.

    A kind with a NUL character counts as absent: no database text column can hold it."""
    for value in (headers.get("x-github-event"), headers.get("x-gitea-event")):
        if value and value.strip() and "\x00" not in value:
            return value
    kind = cairn_body.get("kind") if isinstance(cairn_body, dict) else None
    return kind if isinstance(kind, str) and kind.strip() and "\x00" not in kind else None


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Names lower-cased; signatures, credentials and cookies replaced by «redacted»."""
    redacted: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower()
        redacted[lowered] = REDACTED if lowered in REDACTED_HEADERS else value
    return redacted


# --- payload and title ---------------------------------------------------------------------


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
            value = _json(fields["payload"][0])
            return value, TEXT if value is None else FORM
    value = _json(body)
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


def _json(text: bytes | str) -> object | None:
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


def derive_title(source_type: str, kind: str | None, payload: object | None, *, body: bytes | None = None,
                 size: int | None = None, content_type: str | None = None) -> str:
    """One line of at most 200 characters saying what arrived; never fails on an odd payload.

    A body that is not JSON (`payload` None, and `body` or `size` given) is titled by its size,
    media type and first line of text, not as an anonymous "delivery"."""
    kind = _text(kind)
    if payload is None and (body is not None or size is not None) and not _is_json_null(body):
        return one_line_title(_printable(_not_json_title(kind, body, size, content_type)))
    if source_type in ("github", "gitea"):
        title = _forge_title(kind, payload) if kind else None
    elif source_type == "cairn":
        title = _cairn_title(kind, payload)
    else:
        title = None
    return one_line_title(_printable(title or _generic_title(kind, payload)))


def _is_json_null(body: bytes | None) -> bool:
    return body is not None and body.strip() == b"null"


def _not_json_title(kind: str | None, body: bytes | None, size: int | None, content_type: str | None) -> str:
    """`issues: not JSON, 27 bytes (text/plain): Disk full on web-3`."""
    length = len(body) if body is not None else size or 0
    head = kind or "webhook"
    if length == 0:
        return f"{head}: empty body"
    media_type = _text((content_type or "").split(";", 1)[0].strip().lower())
    described = f"{head}: not JSON, {length:,} byte{'' if length == 1 else 's'}"
    if media_type:
        described += f" ({media_type})"
    first_line = None
    if body is not None:
        chunk = body[:NOT_JSON_PREVIEW_BYTES]
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as error:  # a character cut by the preview's end, or binary
            cut = len(chunk) < len(body) and error.start > len(chunk) - 4
            text = chunk[:error.start].decode("utf-8") if cut else ""
        lines = [line for line in text.splitlines() if line.strip()]
        first_line = _text(lines[0]) if lines else None
    return f"{described}: {first_line}" if first_line else described


def _forge_title(kind: str, payload: object) -> str | None:
    if not isinstance(payload, dict):
        return None
    action = _text(payload.get("action"))
    head = f"{kind} {action}" if action else kind
    repo = _repo_name(payload)
    item = _item(kind, payload)
    if item is not None:
        number = _text(item.get("number"))
        return _headed(head, f"{repo or ''}#{number}" if number else repo, _text(item.get("title")))
    if kind == "push":
        ref = _text(payload.get("ref"))
        change = _ref_change(payload, ref)
        if change is not None:
            return _headed("push", repo, change)
        return _headed("push", repo, ref, _commit_count(payload)) + _head_commit(payload)
    if kind == "ping":
        return _headed("ping", repo or _organization(payload) or _text(payload.get("zen")))
    if kind == "release":
        release = payload.get("release")
        return _headed(head, repo, _text(_dig(release, "tag_name")) or _text(_dig(release, "name")))
    if kind in ("create", "delete"):
        return _headed(head, repo, _text(payload.get("ref_type")), _text(payload.get("ref")))
    if kind in ("check_run", "check_suite", "workflow_run", "workflow_job"):
        return _headed(head, repo, *_run_facts(kind, payload))
    return _headed(head, repo or _organization(payload))


def _ref_change(payload: dict, ref: str | None) -> str | None:
    """`deleted tag v1`, `created branch feature-x`: a push that creates or deletes a ref, as
    GitHub flags it (`created`, `deleted`) or as the all-zero before/after ids say (Gitea)."""
    created = payload.get("created") is True or _zeros(payload.get("before"))
    deleted = payload.get("deleted") is True or _zeros(payload.get("after"))
    if not ref or created == deleted:
        return None
    for prefix, noun in (("refs/tags/", "tag"), ("refs/heads/", "branch")):
        if ref.startswith(prefix) and len(ref) > len(prefix):
            return f"{'created' if created else 'deleted'} {noun} {ref[len(prefix):]}"
    return f"{'created' if created else 'deleted'} {ref}"


def _zeros(value: object) -> bool:
    return isinstance(value, str) and len(value) >= 40 and not value.strip("0")


def _run_facts(kind: str, payload: dict) -> tuple[str | None, ...]:
    """A check or workflow run's name and how it stands: `CI #12 (failure)`, `lint (queued)`."""
    run = payload.get(kind)
    if not isinstance(run, dict):
        return ()
    if kind == "check_suite":
        name = _text(_dig(run, "app", "name"))
        branch = _text(run.get("head_branch"))
        name = f"{name} on {branch}" if name and branch else name or branch
    elif kind == "workflow_job":
        job, workflow = _text(run.get("name")), _text(run.get("workflow_name"))
        name = f"{workflow} / {job}" if job and workflow and job != workflow else job or workflow
    else:
        name = _text(run.get("name"))
        number = _text(run.get("run_number")) if kind == "workflow_run" else None
        if name and number:
            name = f"{name} #{number}"
    standing = _text(run.get("conclusion")) or _text(run.get("status"))
    return name, f"({standing})" if standing else None


def _item(kind: str, payload: dict) -> dict | None:
    """The issue or pull request an event is about; a pull request's own events prefer it."""
    order = ("pull_request", "issue") if kind.startswith("pull_request") else ("issue", "pull_request")
    if kind.startswith("discussion"):
        order = ("discussion",)
    for key in order:
        candidate = payload.get(key)
        if not isinstance(candidate, dict):
            continue
        if _text(candidate.get("number")) or _text(candidate.get("title")):
            return candidate
    return None


def _repo_name(payload: dict) -> str | None:
    repository = payload.get("repository")
    if not isinstance(repository, dict):
        return None
    full_name = _text(repository.get("full_name"))
    if full_name:
        return full_name
    owner, name = _text(_dig(repository, "owner", "login")), _text(repository.get("name"))
    return f"{owner}/{name}" if owner and name else name


def _commit_count(payload: dict) -> str | None:
    total = payload.get("total_commits")  # Gitea counts them all; GitHub lists at most 2048
    if not isinstance(total, int) or isinstance(total, bool):
        commits = payload.get("commits")
        total = len(commits) if isinstance(commits, list) else None
    if total is None:
        return None
    return f"({total} commit{'' if total == 1 else 's'})"


def _head_commit(payload: dict) -> str:
    message = _dig(payload, "head_commit", "message")
    if not isinstance(message, str) or not message.strip():
        return ""
    first_line = _text(message.strip().splitlines()[0])
    return f" — {first_line}" if first_line else ""


def _cairn_title(kind: str | None, payload: object) -> str:
    label = _first_text(payload, CAIRN_TITLE_FIELDS)
    if label is None and isinstance(payload, dict):
        label = _first_text(payload.get("artifact"), CAIRN_TITLE_FIELDS)
    head = f"cairn {kind or 'event'}"
    return f"{head}: {label}" if label else head


def _generic_title(kind: str | None, payload: object) -> str:
    label = _text(payload) if isinstance(payload, str) else _first_text(payload, GENERIC_TITLE_FIELDS)
    if label:
        return f"{kind or 'webhook'}: {label}"
    return f"{kind or 'webhook'} delivery"


def _first_text(payload: object, fields: tuple[str, ...]) -> str | None:
    if not isinstance(payload, dict):
        return None
    for field in fields:
        value = _text(payload.get(field))
        if value:
            return value
    return None


def _dig(value: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _text(value: object) -> str | None:
    """A string or a number as one line of display text; objects, lists, booleans and blanks are None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            return str(value)
        except ValueError:  # an integer past Python's 4300-digit conversion limit
            return None
    if isinstance(value, str):
        return " ".join(_printable(value).split()) or None
    return None


def _join(*parts: str | None) -> str:
    return " ".join(part for part in parts if part)


def _headed(head: str, *parts: str | None) -> str:
    rest = _join(*parts)
    return f"{head}: {rest}" if rest else head


def _organization(payload: dict) -> str | None:
    return _text(_dig(payload, "organization", "login"))


_CONTROLS = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)], " ")
"""Every control character (Unicode category Cc: exactly U+0000–U+001F and U+007F–U+009F)."""


def _printable(text: str) -> str:
    """Control characters (terminal escapes among them) become spaces; lone surrogates `?`."""
    if text.isprintable():  # neither a control character nor a surrogate (the usual title)
        return text
    return text.translate(_CONTROLS).encode(errors="replace").decode()
