"""The contract suite's harness: the application on one store, a manual clock, unique names."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import argon2
import pytest

from tests.doubles import ManualClock
from application.service import Caller, Switchboard
from interfaces.bootstrap import Container

CLI = Caller.cli()


def unique(prefix: str) -> str:
    """A name no other test uses: `prefix-<6 hex>` (valid as agent, queue, key, operator)."""
    return f"{prefix}-{secrets.token_hex(3)}"


def agent(vended: dict[str, Any]) -> Caller:
    """The caller an MCP session of this endpoint acts as."""
    return Caller("endpoint", vended["slug"])


def when(text: str | None) -> datetime | None:
    """Parses an RFC 3339 time of the contract (UTC, `Z`)."""
    if text is None:
        return None
    assert text.endswith("Z"), text
    return datetime.fromisoformat(text)


def raised(call: Callable[[], object]) -> Exception:
    """The exception a call raises (fails the test if it returns)."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - returned to the test, which checks its type
        return error
    pytest.fail("expected the call to be refused")


class CheapArgon2Hasher:
    """The PasswordHasher port with argon2's cheapest parameters.

    This suite tests the stores, not password hashing; the production parameters cost
    about half a second of CPU per operator, which would dominate the suite.
    """

    def __init__(self) -> None:
        self._hasher = argon2.PasswordHasher.from_parameters(argon2.profiles.CHEAPEST)

    def hash(self, password: str) -> str:
        return self._hasher.hash(password)

    def verify(self, password_hash: str, password: str) -> bool:
        try:
            return self._hasher.verify(password_hash, password)
        except argon2.exceptions.VerificationError:
            return False


def container_on(make_container: Callable[..., Container], url: str, clock: ManualClock) -> Container:
    container = make_container(url, clock=clock)
    container.app.hasher = CheapArgon2Hasher()
    return container


@dataclass
class Harness:
    """One 'process' (container) on the test's store, plus shortcuts for the usual setup."""

    container: Container
    clock: ManualClock
    url: str
    make_container: Callable[..., Container]

    @property
    def app(self) -> Switchboard:
        return self.container.app

    def later(self, seconds: float) -> datetime:
        """The clock's now plus some seconds."""
        return self.clock.now() + timedelta(seconds=seconds)

    def tick(self, seconds: float = 1) -> datetime:
        return self.clock.advance(seconds=seconds)

    def vend(self, name: str = "worker", *, queues: list[str] | None = None, **options: Any) -> dict[str, Any]:
        return self.app.vend(unique(name), queues=queues or [unique("q")], caller=CLI, **options)

    def push(self, vended: dict[str, Any], title: str = "do the thing", **options: Any) -> dict[str, Any]:
        """An operator push; returns the row."""
        return self.app.push(vended["slug"], title, caller=CLI, **options)["todo"]

    def todo(self, todo_id: str) -> dict[str, Any]:
        return self.app.get_todo(todo_id, caller=CLI)

    def fire_due(self) -> int:
        """What the scheduler does on a tick: fire every timer due now (read from its projection)."""
        return self.app.fire_timers(self.container.views.due_timers(self.clock.now(), 1000))

    def fail_until_dead(self, vended: dict[str, Any], todo_id: str) -> None:
        """Claims and fails the todo until its budget of attempts is spent."""
        caller = agent(vended)
        while True:
            self.app.claim(todo_id, caller=caller)
            row = self.app.fail(todo_id, caller=caller, summary="broken")
            if row["dead_letter"]:
                return
            self.clock.set(when(row["next_retry_at"]))

    def another_process(self) -> Container:
        """A second container on the same database, as another server or the CLI would be."""
        return container_on(self.make_container, self.url, self.clock)


def mixed_workload(sb: Harness) -> dict[str, str]:
    """Every kind of transition, over several endpoints, operators and keys."""
    bob = unique("bob")
    sb.app.create_operator(bob, "password123", caller=CLI)
    sb.app.mint_operator_token(bob, caller=CLI)
    alpha = sb.vend("alpha", queues=[unique("a"), unique("b")], default_lease_seconds=120)
    beta = sb.vend("beta", owner=bob)
    gamma = sb.vend("gamma")
    sb.app.set_default_lease(alpha["slug"], 600, caller=CLI)
    todos = {}
    for name, vended, queue in [
        ("done", alpha, alpha["queues"][0]), ("retrying", alpha, alpha["queues"][1]),
        ("dead", alpha, None), ("lapsed", beta, None), ("held", gamma, None),
        ("released", beta, None), ("pending", gamma, None), ("revived", alpha, None),
    ]:
        todos[name] = sb.app.push(
            vended["slug"], name, caller=CLI, queue=queue, payload={"name": name}, key=unique("k"),
        )["todo"]["id"]
        sb.tick()
    keyed = sb.app.push(alpha["slug"], "keyed", caller=CLI, key="stable")["todo"]["id"]
    sb.app.push(alpha["slug"], "keyed again", caller=CLI, key="stable")

    sb.app.claim(todos["done"], caller=agent(alpha), require_fence=False)
    sb.app.heartbeat(todos["done"], caller=agent(alpha), lease_ttl_seconds=999999, checkpoint={"step": 1})
    sb.app.complete(todos["done"], caller=agent(alpha), result={"ok": 1}, summary="ok")
    sb.app.claim(todos["retrying"], caller=agent(alpha))
    sb.app.fail(todos["retrying"], caller=agent(alpha))
    sb.fail_until_dead(alpha, todos["dead"])
    sb.fail_until_dead(alpha, todos["revived"])
    sb.app.retry(todos["revived"], caller=Caller.operator("admin"))
    sb.app.claim(todos["lapsed"], caller=agent(beta), lease_ttl_seconds=30)
    sb.app.claim(todos["released"], caller=agent(beta))
    sb.app.release(todos["released"], caller=agent(beta), summary="later")
    sb.app.claim(todos["held"], caller=agent(gamma), require_fence=True)
    sb.app.claim(keyed, caller=agent(alpha))
    sb.app.complete(keyed, caller=agent(alpha))
    todos["keyed"] = keyed
    todos["keyed anew"] = sb.app.push(alpha["slug"], "keyed anew", caller=CLI, key="stable")["todo"]["id"]
    sb.tick(3600)
    sb.fire_due()
    sb.app.revoke(gamma["slug"], caller=CLI)
    todos["claimed"] = sb.push(alpha, "claimed")["id"]
    todos["awaiting retry"] = sb.push(alpha, "awaiting retry")["id"]
    sb.app.claim(todos["claimed"], caller=agent(alpha), require_fence=True)
    sb.app.claim(todos["awaiting retry"], caller=agent(alpha))
    sb.app.fail(todos["awaiting retry"], caller=agent(alpha))
    return todos
