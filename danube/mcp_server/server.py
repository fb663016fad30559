"""Building and running the MCP server: one FastMCP instance with every tool, the
resource and the prompts, on standard input and output (upstream's only transport).
Standard output carries the protocol, so nothing else may print there."""

from mcp.server.fastmcp import FastMCP

from danube.mcp_server import (cluster, diagnostics, guides, logs, metrics, schemas,
                               security, topics)
from danube.mcp_server.context import ToolContext

INSTRUCTIONS = ("Operate a Danube messaging cluster: brokers, namespaces, topics, "
                "subscriptions, schemas, security, metrics and logs. Start with health_check "
                "or list_brokers; use dry_run first for rebalance and unload.")


def build(admin, queries, config):
    mcp = FastMCP("danube-admin", instructions=INSTRUCTIONS, log_level="WARNING")
    ctx = ToolContext(admin, queries, config)
    for part in (cluster, topics, schemas, security, diagnostics, logs, metrics):
        part.register(mcp, ctx)
    guides.register(mcp)
    return mcp


async def run_stdio(admin, queries, config):
    await build(admin, queries, config).run_stdio_async()
