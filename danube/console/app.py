"""The console's Starlette application: routes, templates, static files, and what a broker
error becomes (a page or a JSON answer naming the endpoint and the broker's message, with a
status that says whose fault it is, never a traceback)."""

import contextlib
import os
from urllib.parse import urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from danube.client import errors
from danube.rpc import StatusCode

from danube.console import api, pages
from danube.console.render import FILTERS, broker_status, json_response, render

HERE = os.path.dirname(os.path.abspath(__file__))

def build_app(backend, *, cors_allow_origin=None, close_backend=True):
    """The ASGI app over ``backend`` (danube.console.backend.Backend or any object with its
    methods)."""
    env = Environment(loader=FileSystemLoader(os.path.join(HERE, "templates")),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters.update(FILTERS)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if close_backend:
            await backend.close()

    middleware = [Middleware(_SameOriginPosts)]
    if cors_allow_origin:
        origins = [o.strip() for o in cors_allow_origin.split(",") if o.strip()]
        middleware.append(Middleware(CORSMiddleware, allow_origins=origins,
                                     allow_methods=["GET"], allow_headers=["*"]))
    app = Starlette(routes=pages.routes() + api.routes() + [
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ], middleware=middleware, exception_handlers={
        errors.DanubeError: _broker_error, 404: _not_found, 405: _not_allowed,
    }, lifespan=lifespan)
    app.state.backend = backend
    app.state.templates = env
    app.state.cors_allow_origin = cors_allow_origin
    return app


async def _broker_error(request, exc):
    status = broker_status(exc)
    endpoint = request.app.state.backend.endpoint
    if request.url.path.startswith("/api/"):
        return json_response({"error": str(exc), "code": exc.code.name if exc.code else None,
                              "endpoint": endpoint}, status)
    unreachable = exc.code in (StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED)
    return render(request, "error.html", status, message=str(exc), unreachable=unreachable,
                  title="Broker unreachable" if unreachable else "The broker refused")


async def _not_found(request, exc):
    if request.url.path.startswith("/api/"):
        return json_response({"error": f"no such page: {request.url.path}"}, 404)
    return render(request, "error.html", 404, title="Not found", unreachable=False,
                  message=f"no such page: {request.url.path}")


async def _not_allowed(request, exc):
    return render(request, "error.html", 405, title="Not allowed", unreachable=False,
                  message=f"{request.method} is not allowed on {request.url.path}")


class _SameOriginPosts:
    """The console has write actions and no login: a form posted from another site's page
    (a browser sends its Origin) is refused, so visiting a page elsewhere cannot act on the
    broker through a console on localhost."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin", b"").decode("latin-1")
            host = headers.get(b"host", b"").decode("latin-1")
            if origin and origin != "null" and urlsplit(origin).netloc != host:
                response = Response(f"cross-origin form post from {origin} refused\n",
                                    status_code=403, media_type="text/plain")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
