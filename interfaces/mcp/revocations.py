"""Ends the live MCP sessions of endpoints revoked or expired, by this process or any other
(docs/adr/0010-mcp-transport.md): at once when a revocation is committed here, and by a sweep
every `REVOCATION_SWEEP_SECONDS` for the others' (one aggregate load per endpoint with a session)."""

from __future__ import annotations

import asyncio
import logging

import anyio
import anyio.to_thread

from application.background import OutageLog
from application.errors import StoreUnavailable
from domain.errors import DomainError
from interfaces.mcp.sessions import SessionManager, SessionRegistry
from interfaces.mcp.tools import Services

log = logging.getLogger("switchboard.mcp")

REVOCATION_SWEEP_SECONDS = 1.0
"""How late another process's revocation ends this process's streams."""


class RevocationSweep:
    """The sweep; `wake()` (from any thread, through the gateway) makes it look now."""

    def __init__(self, services: Services, registry: SessionRegistry, manager: SessionManager,
                 every: float = REVOCATION_SWEEP_SECONDS) -> None:
        self.services = services
        self.registry = registry
        self.manager = manager
        self.every = every
        self._failed = False
        self._outage = OutageLog(log, "revocation sweep", f"sweeping again every {every:.0f} s")
        self.woken: asyncio.Event | None = None

    async def run(self) -> None:
        """Sweeps until cancelled (in the gateway's lifespan)."""
        self.woken = asyncio.Event()
        while True:
            with anyio.move_on_after(self.every):
                await self.woken.wait()
            self.woken.clear()
            await self.sweep()

    async def sweep(self) -> None:
        self.manager.forget_gone()
        self._failed = False
        for endpoint_id, slug in self.registry.endpoints().items():
            if await self._still_active(slug):
                continue
            for session in self.registry.of_endpoint(endpoint_id):
                log.info("ending MCP session %s of revoked endpoint %s", session.session_id[:8], slug)
                await self.manager.end(session.session_id)
        if not self._failed:
            self._outage.succeeded()

    async def _still_active(self, slug: str) -> bool:
        try:
            await anyio.to_thread.run_sync(self.services.app.endpoint_caller, slug)
        except DomainError:
            return False
        except StoreUnavailable as error:  # an outage is not a revocation: one line, look again next sweep
            self._outage.failed(error)
            self._failed = True
        except Exception:  # any other failure is not a revocation either: look again on the next sweep
            log.warning("revocation sweep could not load endpoint %s", slug, exc_info=True)
        return True
