"""Two guards around the MCP SDK's transport (python-sdk#2741): a session that ends under a
notification makes the SDK answer 202, then start a 500 on the same request and log the
ClosedResourceError it raises. `AnsweredOnce` drops the second answer, `EndedSessionRace` turns the
SDK's traceback into the one INFO line the gateway writes."""

from __future__ import annotations

import logging

import anyio
from starlette.types import Message, Send

log = logging.getLogger("switchboard.mcp")


class EndedSessionRace(logging.Filter):
    """The SDK logs its ClosedResourceError (python-sdk#2741) with a traceback before raising it,
    though the gateway handles it (`handle`): that record becomes the one-line INFO the gateway
    writes, not an ERROR with a traceback in the operator's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], anyio.ClosedResourceError):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            record.msg, record.args = "%s (a session that ended under the request; handled)", (record.getMessage(),)
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


SDK_TRANSPORT_LOG = logging.getLogger("mcp.server.streamable_http")
SDK_TRANSPORT_LOG.addFilter(EndedSessionRace())


class AnsweredOnce:
    """An ASGI `send` that passes one response and drops anything sent after it completed.

    The MCP SDK answers a notification 202, then, finding the session's stream closed, starts a
    500 on the same request; uvicorn refuses that with a RuntimeError, which would hide the
    SDK's own ClosedResourceError (which the gateway handles) behind a 500 traceback.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self.completed = False

    async def __call__(self, message: Message) -> None:
        if self.completed:
            log.debug("dropped %s after the response completed", message["type"])
            return
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.completed = True
        await self._send(message)

