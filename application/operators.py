"""Operators: create, reset a password, mint an API token, sign in; and the installation's
recorded base URL. Each command returns what it generated (a password or token) or None."""

from __future__ import annotations

import base64
import secrets

from application.access import Caller, holder_of
from application.ports import EventStore, PasswordHasher, UnitOfWork, Views
from domain.endpoint import credential_hash
from domain.errors import Conflict, InvalidArgument, NotFound
from domain.installation import INSTALLATION_ID, Installation
from domain.names import OPERATOR_PREFIX, parse_id
from domain.operator import Operator, check_operator_name, operator_uuid


def new_secret(prefix: str) -> str:
    """`prefix` + 43 base64url characters (32 random bytes)."""
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


class Operators:
    def __init__(self, store: EventStore, views: Views, hasher: PasswordHasher) -> None:
        self.store = store
        self.views = views
        self.hasher = hasher

    def _new_password(self, password: str | None) -> tuple[str, str]:
        """The given password (at least 8 characters) or a generated one, with its hash."""
        password = password if password is not None else secrets.token_urlsafe(18)
        if len(password) < 8:
            raise InvalidArgument("password must be at least 8 characters")
        return password, self.hasher.hash(password)

    def create(self, name: str, password: str | None = None, *, caller: Caller) -> str | None:
        """Creates an operator; returns the generated password when none was given."""
        check_operator_name(name)
        generated = password is None
        password, password_hash = self._new_password(password)

        def handler(uow: UnitOfWork) -> None:
            if uow.get(Operator, operator_uuid(name)) is not None:
                raise Conflict(f"operator {name} already exists")
            uow.add(Operator.create(name=name, password_hash=password_hash, now=uow.now, actor=caller.label))

        self.store.run(handler)
        return password if generated else None

    def ensure_admin(self) -> str | None:
        """On an empty store, creates operator `admin`; returns its password, else None."""
        if self.store.load(Operator, operator_uuid("admin")) is not None:
            return None
        try:
            return self.create("admin", caller=Caller("system", "bootstrap"))
        except Conflict:
            return None

    def reset_password(self, name: str, password: str | None = None, *, caller: Caller) -> str | None:
        """Sets a new password (an event); returns the generated one when none was given."""
        check_operator_name(name)
        generated = password is None
        password, password_hash = self._new_password(password)

        def handler(uow: UnitOfWork) -> None:
            operator = uow.get(Operator, operator_uuid(name))
            if operator is None:
                raise NotFound(f"operator {name} not found")
            operator.reset_password(password_hash=password_hash, now=uow.now, actor=caller.label)

        self.store.run(handler)
        return password if generated else None

    def mint_token(self, name: str, *, caller: Caller) -> str:
        """Mints an `sbo_` API token; only its hash is kept."""
        token = new_secret("sbo_")

        def handler(uow: UnitOfWork) -> None:
            operator = uow.get(Operator, operator_uuid(check_operator_name(name)))
            if operator is None:
                raise NotFound(f"operator {name} not found")
            operator.mint_token(token_sha256=credential_hash(token), now=uow.now, actor=caller.label)

        self.store.run(handler)
        return token

    def verify_password(self, name: str, password: str) -> bool:
        try:
            operator = self.store.load(Operator, operator_uuid(check_operator_name(name)))
        except InvalidArgument:
            operator = None
        if operator is None:
            self.hasher.hash(password)  # as slow as a wrong password: no timing oracle for names
            return False
        return self.hasher.verify(operator.password_hash, password)

    def authenticate_token(self, token: str) -> Caller | None:
        """The operator holding this `sbo_` API token, or None (an `sbk_` credential never is one)."""
        if not token.startswith("sbo_"):
            return None
        sha256 = credential_hash(token)
        holder = holder_of(self.views, sha256, "operator")
        if holder is None:
            return None
        operator = self.store.load(Operator, parse_id(OPERATOR_PREFIX, holder))
        if operator is None or sha256 not in operator.token_hashes:
            return None
        return Caller.operator(operator.name)

    def exists(self, name: str) -> bool:
        try:
            return self.store.load(Operator, operator_uuid(check_operator_name(name))) is not None
        except InvalidArgument:
            return False

    # -- the installation ----------------------------------------------------------------

    def record_base_url(self, base_url: str, *, caller: Caller) -> bool:
        """Records the base URL this server mints links with; an event only when it changed."""

        def handler(uow: UnitOfWork) -> bool:
            installation = uow.get(Installation, INSTALLATION_ID)
            if installation is None:
                installation = Installation.new()
                changed = installation.record_base_url(base_url=base_url, now=uow.now, actor=caller.label)
                uow.add(installation)
                return changed
            return installation.record_base_url(base_url=base_url, now=uow.now, actor=caller.label)

        return self.store.run(handler)

    def recorded_base_url(self) -> str | None:
        """The base URL `serve` recorded last, if any."""
        installation = self.store.load(Installation, INSTALLATION_ID)
        return installation.base_url if installation is not None else None
