"""An agent that dies mid-work: run as its own process by tests/e2e/test_attempts.py.

It connects with the official `mcp` client (configured from the vended `mcp_json` in
`SWITCHBOARD_TEST_MCP_JSON`), claims the next todo under a lease of `SWITCHBOARD_TEST_LEASE`
seconds, heartbeats once with the checkpoint in `SWITCHBOARD_TEST_CHECKPOINT`, prints the claim's
and the heartbeat's answers as one JSON line, and then waits to be killed — it never completes.
"""

from __future__ import annotations

import json
import os
import sys

import anyio
import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    server = json.loads(os.environ["SWITCHBOARD_TEST_MCP_JSON"])["mcpServers"]["switchboard"]
    lease = float(os.environ["SWITCHBOARD_TEST_LEASE"])
    checkpoint = json.loads(os.environ["SWITCHBOARD_TEST_CHECKPOINT"])
    async with httpx2.AsyncClient(headers=server["headers"], timeout=httpx2.Timeout(30, read=300)) as http:
        async with Client(streamable_http_client(server["url"], http_client=http)) as client:
            claimed = await client.call_tool("claim_next", {"lease_ttl_seconds": lease, "claimant": "agent-a"})
            assert not claimed.is_error, claimed.content
            todo = claimed.structured_content["todo"]
            beat = await client.call_tool("heartbeat", {"id": todo["id"], "lease_ttl_seconds": lease,
                                                        "checkpoint": checkpoint})
            assert not beat.is_error, beat.content
            print(json.dumps({"claim": todo, "heartbeat": beat.structured_content}), flush=True)
            await anyio.sleep_forever()  # working… until SIGKILL


if __name__ == "__main__":
    sys.exit(anyio.run(main))
