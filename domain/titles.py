"""A todo's one-line title, derived from what arrived (CONTRACT §4 and §6).

Forge events are titled by what they are about (`push to main of acme/api: 3 commits`), Stripe
events by their object (`invoice.paid: in_1Mt…`), Slack events by where they happened
(`message in C0123: the text`), cairn, Standard Webhooks and generic deliveries by their own title fields, and a body that is not JSON by its size, media
type and first line. A title never fails on an odd payload and is at most 200 characters.
"""

from __future__ import annotations

from domain.todo_fields import one_line_title

GENERIC_TITLE_FIELDS = ("title", "name", "summary", "message")
CAIRN_TITLE_FIELDS = ("subject", "name", "title")
STRIPE_ABOUT_FIELDS = ("customer_email", "email", "description", "name")
NOT_JSON_PREVIEW_BYTES = 1024  # how much of a body that is not JSON is read for its title


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
    elif source_type in _SENDER_TITLES:
        title = _SENDER_TITLES[source_type](kind, payload)
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


def _stripe_title(kind: str | None, payload: object) -> str | None:
    """`invoice.paid: in_1MtHbE (billing@example.com)`: the event type, its object's id and who or what."""
    obj = _dig(payload, "data", "object")
    if not isinstance(obj, dict):
        return None
    about = _first_text(obj, STRIPE_ABOUT_FIELDS)
    return _headed(kind or "stripe event", _text(obj.get("id")), f"({about})" if about else None)


def _slack_title(kind: str | None, payload: object) -> str | None:
    """`message in C0123: the text`, `reaction_added in C0123: thumbsup`, `app_home_opened by U0456`."""
    event = _dig(payload, "event")
    if not isinstance(event, dict):
        return None
    head = _text(event.get("type")) or kind or "slack event"
    channel = _text(event.get("channel")) or _text(_dig(event, "item", "channel"))
    where = f"{head} in {channel}" if channel else head
    if not channel and (user := _text(event.get("user"))):
        where = f"{head} by {user}"
    return _headed(where, _text(event.get("text")) or _text(event.get("reaction")))


def _standard_title(kind: str | None, payload: object) -> str | None:
    """`invoice.created: Monthly plan`: the `type` and a title field of the payload or of its `data`."""
    data = _dig(payload, "data")
    label = _first_text(payload, GENERIC_TITLE_FIELDS) or _first_text(data, (*GENERIC_TITLE_FIELDS, "id"))
    return _headed(kind or "webhook", label) if label else None


_SENDER_TITLES = {"stripe": _stripe_title, "slack": _slack_title, "standard": _standard_title}


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
