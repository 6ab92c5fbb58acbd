"""Unit: the pure parts of CONTRACT §12's keys, first start, base URL and request hygiene."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from uuid import uuid4

import pytest

from application.errors import ConfigurationError
from domain.errors import Conflict, InvalidArgument
from domain.signatures import SignatureRefused, check_single_signatures
from domain.installation import BaseUrlRecorded, Installation
from domain.operator import Operator, OperatorPasswordReset
from domain.webhook import Webhook, WebhookSecretResealed
from interfaces.crypto import AesGcmSecretBox, DeferredSecretBox
from interfaces.http.hygiene import MAX_HEADER_BYTES, header_bytes
from interfaces.json_depth import json_too_deep
from interfaces.settings import Settings

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


def test_the_base_url_is_recorded_only_when_it_changes():
    installation = Installation.new()
    assert installation.record_base_url(base_url="http://127.0.0.1:9000/", now=NOW, actor="system:serve")
    assert not installation.record_base_url(base_url="http://127.0.0.1:9000", now=NOW, actor="system:serve")
    assert installation.record_base_url(base_url="https://sb.example", now=NOW, actor="system:serve")
    events = installation.collect_events()
    assert [e.base_url for e in events] == ["http://127.0.0.1:9000", "https://sb.example"]
    assert all(isinstance(e, BaseUrlRecorded) for e in events)
    assert Installation.replay(events).base_url == "https://sb.example"
    with pytest.raises(InvalidArgument):
        installation.record_base_url(base_url="ftp://x", now=NOW, actor="system:serve")


def test_a_password_reset_replaces_the_hash():
    operator = Operator.create(name="admin", password_hash="old", now=NOW, actor="system:bootstrap")
    operator.reset_password(password_hash="new", now=NOW, actor="operator:cli")
    events = operator.collect_events()
    assert isinstance(events[-1], OperatorPasswordReset) and events[-1].actor == "operator:cli"
    assert Operator.replay(events).password_hash == "new"


def _webhook(secret_ciphertext: str | None) -> Webhook:
    return Webhook.create(id=uuid4(), now=NOW, actor="operator:cli", endpoint_id="ep_x", source_type="github",
                          target_queue="q", trust_mode="signed", token_sha256="t", secret_ciphertext=secret_ciphertext)


def test_a_reseal_keeps_url_and_secret_and_needs_a_live_signed_webhook():
    webhook = _webhook("v1:old")
    webhook.reseal_secret(now=NOW, actor="operator:cli", secret_ciphertext="v1:new")
    events = webhook.collect_events()
    assert isinstance(events[-1], WebhookSecretResealed)
    replayed = Webhook.replay(events)
    assert replayed.secret_ciphertext == "v1:new" and replayed.token_sha256 == "t"
    with pytest.raises(Conflict):
        _webhook(None).reseal_secret(now=NOW, actor="operator:cli", secret_ciphertext="v1:new")
    replayed.delete(now=NOW, actor="operator:cli")
    with pytest.raises(Conflict):
        replayed.reseal_secret(now=NOW, actor="operator:cli", secret_ciphertext="v1:x")


@pytest.mark.parametrize(("source", "names", "refused"), [
    ("github", ["X-Hub-Signature-256", "x-hub-signature-256"], True),
    ("gitea", ["x-gitea-signature", "X-Gitea-Signature"], True),
    ("cairn", ["x-cairn-signature", "x-cairn-signature", "x-cairn-signature"], True),
    ("gitea", ["x-gitea-signature", "x-hub-signature-256"], False),  # two kinds, once each
    ("github", ["x-hub-signature-256", "x-github-event", "x-github-event"], False),
    ("generic", ["x-hub-signature-256", "x-hub-signature-256"], False),  # nothing is checked
])
def test_a_signature_header_counts_once(source, names, refused):
    if refused:
        with pytest.raises(SignatureRefused):
            check_single_signatures(source, names)
    else:
        check_single_signatures(source, names)


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("text", "deep"), [
    (_nest(128), False),
    (_nest(129), True),
    ('{"a": ' + _nest(128) + "}", True),
    (json.dumps({"s": "[" * 5000, "t": "{" * 5000}), False),  # brackets in strings
    (json.dumps({"s": 'a\\"[[[' * 300}), False),  # escaped quotes inside a string
    ('{"x": "\\\\", "y": ' + _nest(129) + "}", True),  # an escaped backslash closes nothing
    ("[" + ",".join(["[]"] * 10_000) + "]", False),  # wide, not deep
    ("", False),
])
def test_json_depth(text, deep):
    assert json_too_deep(text.encode()) is deep


def test_header_bytes_counts_names_values_and_the_request_line():
    scope = {"method": "GET", "raw_path": b"/healthz", "query_string": b"", "headers": [(b"x-a", b"b" * 100)]}
    assert 100 < header_bytes(scope) < 140
    big = dict(scope, headers=[(b"x-pad", b"a" * MAX_HEADER_BYTES)])
    assert header_bytes(big) > MAX_HEADER_BYTES


@pytest.mark.parametrize("key", ["", "abc", "z" * 64, "a" * 63])
def test_a_secret_key_is_64_hex_characters(key):
    settings = Settings(secret_key=key or None, database_url="sqlite:///x.db")
    if not key:
        settings.check()
        return
    with pytest.raises(ConfigurationError, match="64 hex"):
        settings.check()


def test_on_postgresql_a_key_is_required_and_never_generated(tmp_path):
    settings = Settings(database_url="postgresql://u@h/db", data_dir=str(tmp_path))
    with pytest.raises(ConfigurationError, match="must be set on PostgreSQL"):
        settings.check()
    box = DeferredSecretBox(settings.resolved_secret_key)  # built without a key: refuses on use
    with pytest.raises(ConfigurationError):
        box.encrypt("whsec_x")
    assert not (tmp_path / "secret-key").exists()
    keyed = Settings(database_url="postgresql://u@h/db", secret_key="ab" * 32)
    keyed.check()
    sealed = DeferredSecretBox(keyed.resolved_secret_key).encrypt("whsec_x")
    assert AesGcmSecretBox("ab" * 32).decrypt(sealed) == "whsec_x"


def test_settings_from_env_know_an_explicit_base_url_and_the_body_timeout():
    assert not Settings.from_env({}).base_url_explicit
    assert Settings.from_env({}).body_timeout == 30
    env = Settings.from_env({"SWITCHBOARD_BASE_URL": "https://sb.example", "SWITCHBOARD_BODY_TIMEOUT": "2.5"})
    assert env.base_url_explicit and env.base_url == "https://sb.example" and env.body_timeout == 2.5
    with pytest.raises(ConfigurationError):
        Settings.from_env({"SWITCHBOARD_BODY_TIMEOUT": "soon"})
    with pytest.raises(ConfigurationError):
        Settings(body_timeout=0).check()
