"""Prometheus's HTTP API, as upstream danube-admin reads it for the admin UI's JSON API and
the MCP server's metrics tools: a small client (`client.py`) and upstream's PromQL queries
(`queries.py`). It imports nothing of danube: both edges use it beside the admin client."""
