"""The UI API as an ASGI app, and its place in front of the web console.

Routing reads the raw (still percent-encoded) path, as upstream's axum router does: a
topic travels as one encoded segment (`/ui/v1/topics/%2Fdefault%2Fevents`), so
`/ui/v1/topics/%2Fdefault%2Fseries` is a topic's page and `/ui/v1/topics/%2Fdefault/series`
its series. A fixed segment wins over a parameter (`/ui/v1/topics/actions`).

Browsers: upstream's admin UI runs on another origin (http://localhost:5173 by default)
and calls this API from the page, so the API answers CORS for the origins given with
--cors-allow-origin ("*" for any, as upstream's permissive layer) and, without it, for
pages served from this machine (localhost, 127.0.0.1, [::1], any port). Upstream allows
every origin; an API with write actions and no login does not by default here
(docs/compatibility)."""

from urllib.parse import unquote

from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse

from danube.client import errors as client_errors

from danube.adminui import actions, reads
from danube.adminui.http import BadRequest, map_error

PREFIX = "/ui/v1"
LOOPBACK_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"

# (method, segments after /ui/v1, handler); None is a parameter segment
ROUTES = (
    ("GET", ("health",), reads.health),
    ("GET", ("cluster",), reads.cluster),
    ("POST", ("cluster", "actions"), actions.cluster_actions),
    ("GET", ("cluster", "balance"), reads.cluster_balance),
    ("POST", ("cluster", "rebalance"), actions.cluster_rebalance),
    ("GET", ("cluster", "raft"), reads.raft_status),
    ("POST", ("cluster", "raft", "actions"), actions.raft_actions),
    ("GET", ("topics",), reads.topics),
    ("GET", ("namespaces",), reads.namespaces),
    ("GET", ("brokers", None), reads.broker),
    ("GET", ("topics", None), reads.topic),
    ("GET", ("topics", None, "series"), reads.topic_series),
    ("POST", ("topics", "actions"), actions.topic_actions),
    ("GET", ("schemas",), reads.schemas),
    ("GET", ("schemas", None), reads.schema_detail),
    ("POST", ("schemas", "actions"), actions.schema_actions),
    ("GET", ("security", "roles"), reads.roles),
    ("GET", ("security", "bindings"), reads.bindings),
    ("POST", ("security", "roles", "actions"), actions.role_actions),
    ("POST", ("security", "bindings", "actions"), actions.binding_actions),
)


def match(segments):
    """[(method, handler, params)] of the routes whose pattern fits, fixed segments first."""
    best, best_rank = [], None
    for method, pattern, handler in ROUTES:
        if len(pattern) != len(segments):
            continue
        params, rank = [], []
        for want, got in zip(pattern, segments):
            if want is None:
                if not got:
                    break
                params.append(got)
                rank.append(1)
            elif want == got:
                rank.append(0)
            else:
                break
        else:
            if best_rank is None or rank < best_rank:
                best, best_rank = [(method, handler, params)], rank
            elif rank == best_rank:
                best.append((method, handler, params))
    return best


class UiApi:
    """The ASGI app of /ui/v1 over a UiState."""

    def __init__(self, state):
        self.state = state

    async def __call__(self, scope, receive, send):
        request = Request(scope, receive)
        response = await self.respond(request)
        await response(scope, receive, send)

    async def respond(self, request):
        raw = request.scope.get("raw_path") or request.scope["path"].encode()
        path = raw.split(b"?", 1)[0].decode("latin-1")
        rest = path[len(PREFIX):].strip("/") if path.startswith(PREFIX) else None
        found = match([unquote(s) for s in rest.split("/")]) if rest is not None else []
        if not found:
            return JSONResponse({"error": f"no such endpoint: {path}"}, 404)
        chosen = [(h, p) for m, h, p in found if m == request.method or
                  (request.method == "HEAD" and m == "GET")]
        if not chosen:
            allowed = ", ".join(sorted({m for m, _, _ in found}))
            return JSONResponse({"error": f"{request.method} is not allowed on {path}"}, 405,
                                headers={"Allow": allowed})
        handler, params = chosen[0]
        try:
            return await handler(self.state, request, *params)
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, exc.status)
        except client_errors.DanubeError as exc:
            return map_error(exc)


def with_ui_api(console, state, cors_allow_origin=None):
    """An ASGI app that serves /ui/v1 from the UI API and every other path from `console`."""
    origins = [o.strip() for o in (cors_allow_origin or "").split(",") if o.strip()]
    api = CORSMiddleware(UiApi(state), allow_origins=origins,
                         allow_origin_regex=None if origins else LOOPBACK_ORIGINS,
                         allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                         max_age=600)

    async def app(scope, receive, send):
        if scope["type"] == "http" and (scope["path"] == PREFIX or
                                        scope["path"].startswith(PREFIX + "/")):
            await api(scope, receive, send)
        else:
            await console(scope, receive, send)
    return app
