"""The HTTP side of `/mcp/{slug}` that no MCP SDK call decides: the JSON refusals (401, 403, 404,
405, 413, 400, 503), the bearer credential, the headers as the SDK reads them, a body read within
its limit, and the Host/Origin settings of the SDK's DNS-rebinding protection."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Message, Receive, Scope, Send

from interfaces.asgi_body import BodyTooLarge, read_body

MAX_BODY = 1024 * 1024
MAX_CREDENTIAL_CHARS = 256
WWW_AUTHENTICATE = 'Bearer realm="switchboard"'
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def transport_security(base_url: str) -> TransportSecuritySettings:
    """DNS-rebinding protection on: the base URL's host plus the loopback names, any port."""
    hosts = list(_LOCAL_HOSTS)
    origins = [f"{scheme}://{host}" for host in _LOCAL_HOSTS for scheme in ("http", "https")]
    parts = urlsplit(base_url)
    if parts.hostname:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        if host not in hosts:
            hosts.append(host)
        origins.append(f"{parts.scheme}://{host}")
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*hosts, *(f"{h}:*" for h in hosts)],
        allowed_origins=[*origins, *(f"{o}:*" for o in origins)],
    )


async def respond(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


async def refuse(send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
    await respond(send, status, {"error": message, "code": code}, headers)


async def unauthorized(send: Send) -> None:
    await refuse(send, 401, "unauthorized", "missing, unknown, revoked or expired credential",
                 {"WWW-Authenticate": WWW_AUTHENTICATE})


def first_headers(scope: Scope) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name, the first of each name as Starlette reads them."""
    return dict(reversed(scope.get("headers", ())))


def header(scope: Scope, name: str) -> str | None:
    key = name.lower().encode()
    for k, v in scope.get("headers", ()):
        if k == key:
            return v.decode("latin-1")
    return None


def bearer(scope: Scope) -> str | None:
    value = header(scope, "authorization")
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential or len(credential) > MAX_CREDENTIAL_CHARS:
        return None
    return credential


async def read_limited_body(headers: dict[bytes, bytes], receive: Receive) -> tuple[bytes, list[Message]]:
    """The whole body (at most MAX_BODY bytes, else BodyTooLarge) and any message read past it."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_BODY:
        raise BodyTooLarge
    body, gone = await read_body(receive, MAX_BODY)
    return body, [] if gone is None else [gone]
