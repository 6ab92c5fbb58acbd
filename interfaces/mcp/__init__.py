"""The MCP interface (CONTRACT §7): Streamable HTTP at `/mcp/{slug}`, one tool per endpoint verb."""

from interfaces.mcp.gateway import McpGateway, mcp_route
from interfaces.mcp.tools import Services

__all__ = ["McpGateway", "Services", "mcp_route"]
