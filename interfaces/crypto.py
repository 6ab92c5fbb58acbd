"""Secrets at rest: AES-256-GCM under a key derived from SWITCHBOARD_SECRET_KEY (the SecretBox port)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_PREFIX = "v1:"


class AesGcmSecretBox:
    """`encrypt` gives `v1:<base64(nonce || ciphertext)>`; only this key can `decrypt` it."""

    def __init__(self, secret_key: str) -> None:
        self._aead = AESGCM(hashlib.sha256(b"switchboard/secret-box\x00" + secret_key.encode()).digest())

    def encrypt(self, plaintext: str) -> str:
        nonce = os.urandom(12)
        return _PREFIX + base64.b64encode(nonce + self._aead.encrypt(nonce, plaintext.encode(), None)).decode()

    def decrypt(self, token: str) -> str:
        """Raises ValueError when the token was not sealed with this key."""
        if not token.startswith(_PREFIX):
            raise ValueError("not a sealed secret")
        raw = base64.b64decode(token[len(_PREFIX):])
        try:
            return self._aead.decrypt(raw[:12], raw[12:], None).decode()
        except InvalidTag:
            raise ValueError("secret was sealed with another SWITCHBOARD_SECRET_KEY") from None


class DeferredSecretBox:
    """An AesGcmSecretBox whose key is resolved on first use: a CLI command that never touches a
    signing secret needs no key (on PostgreSQL, one must be set explicitly to seal or open)."""

    def __init__(self, resolve_key: Callable[[], str]) -> None:
        self._resolve_key = resolve_key
        self._box: AesGcmSecretBox | None = None

    def _opened(self) -> AesGcmSecretBox:
        if self._box is None:
            self._box = AesGcmSecretBox(self._resolve_key())
        return self._box

    def encrypt(self, plaintext: str) -> str:
        return self._opened().encrypt(plaintext)

    def decrypt(self, token: str) -> str:
        """Raises ValueError when the token was not sealed with this key."""
        return self._opened().decrypt(token)
