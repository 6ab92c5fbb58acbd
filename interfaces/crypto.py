"""Secrets at rest: AES-256-GCM under a key derived from SWITCHBOARD_SECRET_KEY (the SecretBox port)."""

from __future__ import annotations

import base64
import hashlib
import os

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
