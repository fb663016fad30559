"""What the tools share: the admin client, the Prometheus queries, the config. `call`
returns the answer, or raises Failed with the text upstream's tool shows ("Error listing
brokers: ..."): upstream's tools answer a failed call with that text, not a protocol error."""

import inspect

from danube.client import errors as client_errors


class Failed(Exception):
    pass


class ToolContext:
    def __init__(self, admin, queries, config):
        self.admin = admin
        self.queries = queries
        self.config = config

    async def call(self, service, method, request=None, *, doing):
        try:
            return await self.admin.call(service, method, request)
        except client_errors.DanubeError as exc:
            raise Failed(f"Error {doing}: {exc}") from None


def text_tool(mcp):
    """A decorator registering an async function that returns text as a tool named after
    it, its docstring the description; Failed becomes the tool's text answer."""
    return lambda fn: _register(mcp, fn)


def _register(mcp, fn):
    async def run(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except Failed as exc:
            return str(exc)
    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    run.__signature__ = inspect.signature(fn)
    run.__annotations__ = fn.__annotations__
    mcp.add_tool(run, name=fn.__name__, description=inspect.cleandoc(fn.__doc__ or ""),
                 structured_output=False)
    return fn

