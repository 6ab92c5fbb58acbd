"""A notification reaching an MCP session as it ends (python-sdk#2741), with the SDK's own transport.

The SDK answers 202, then finds the session's stream closed, starts a 500 on the same request and
raises ClosedResourceError. uvicorn refuses a second response with a RuntimeError; the gateway's
AnsweredOnce drops it, so the ClosedResourceError the gateway handles is what comes out.
"""

from __future__ import annotations

import json

import anyio
from mcp.server.streamable_http import StreamableHTTPServerTransport

from interfaces.mcp.sdk_guards import AnsweredOnce

SESSION = "a-session-that-ends"


def uvicorn_like(sent: list[tuple[str, int | None]]):
    """A `send` as strict as uvicorn's: nothing after a completed response."""
    done = False

    async def send(message) -> None:
        nonlocal done
        if done:
            raise RuntimeError(f"Unexpected ASGI message {message['type']!r} after response completed")
        sent.append((message["type"], message.get("status")))
        done = message["type"] == "http.response.body" and not message.get("more_body", False)

    return send


async def post_to_an_ended_session(send) -> BaseException | None:
    """What `handle_request` raised, or None."""
    raised: BaseException | None = None
    transport = StreamableHTTPServerTransport(mcp_session_id=SESSION)
    async with transport.connect():
        await transport._read_stream_writer.aclose()  # the session's side ends under the request
        body = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        scope = {
            "type": "http", "method": "POST", "path": "/mcp", "query_string": b"", "scheme": "http",
            "server": ("localhost", 80), "headers": [
                (b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
                (b"mcp-session-id", SESSION.encode()), (b"mcp-protocol-version", b"2025-06-18"),
                (b"host", b"localhost"),
            ],
        }
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await anyio.sleep(10)

        try:
            with anyio.fail_after(5):
                await transport.handle_request(scope, receive, send)
        except Exception as error:  # noqa: BLE001 - the test looks at what escaped
            raised = error
    return raised


def test_without_the_guard_uvicorn_would_refuse_the_sdks_second_answer():
    sent: list[tuple[str, int | None]] = []
    raised = anyio.run(post_to_an_ended_session, uvicorn_like(sent))
    assert isinstance(raised, RuntimeError) and "after response completed" in str(raised)
    assert sent[0] == ("http.response.start", 202)


def test_the_guard_passes_the_202_and_lets_the_handled_error_out():
    sent: list[tuple[str, int | None]] = []
    guard = AnsweredOnce(uvicorn_like(sent))
    raised = anyio.run(post_to_an_ended_session, guard)
    assert isinstance(raised, anyio.ClosedResourceError)
    assert sent == [("http.response.start", 202), ("http.response.body", None)]
    assert guard.completed


def test_the_sdks_traceback_for_the_handled_race_stays_out_of_the_log(caplog):
    import logging

    sent: list[tuple[str, int | None]] = []
    with caplog.at_level(logging.INFO, logger="mcp.server.streamable_http"):
        raised = anyio.run(post_to_an_ended_session, AnsweredOnce(uvicorn_like(sent)))
    assert isinstance(raised, anyio.ClosedResourceError)
    records = [r for r in caplog.records if r.name == "mcp.server.streamable_http"]
    assert records, "the SDK logged nothing: this test checks nothing"
    assert all(r.levelno == logging.INFO and r.exc_info is None for r in records), records
    assert "handled" in records[0].getMessage()
