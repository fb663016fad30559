"""`danube admin serve --mode mcp`: upstream danube-admin's MCP server (danube-admin/src/mcp/)
on the MCP Python SDK (`pip install 'danube-broker-py[mcp]'`): the same tools (names,
arguments, text results), the metrics catalog resource and the four workflow prompts, on
standard input and output as upstream. The tools reach the broker through the admin client
and Prometheus through danube.promql, nothing else."""
