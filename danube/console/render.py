"""Rendering shared by the pages and the JSON endpoints: a template with the console's
filters, a JSON answer, and the HTTP status a broker error becomes."""

from urllib.parse import quote

import orjson
from starlette.responses import HTMLResponse, Response

from danube.rpc import StatusCode

#: A broker error's gRPC code -> the console's HTTP status.
HTTP_STATUS = {
    StatusCode.NOT_FOUND: 404, StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.ALREADY_EXISTS: 409, StatusCode.FAILED_PRECONDITION: 409,
    StatusCode.PERMISSION_DENIED: 403, StatusCode.UNAUTHENTICATED: 401,
    StatusCode.UNAVAILABLE: 503, StatusCode.DEADLINE_EXCEEDED: 504,
}


def render(request, template, status=200, **context):
    env = request.app.state.templates
    context.setdefault("endpoint", request.app.state.backend.endpoint)
    context["request"] = request
    return HTMLResponse(env.get_template(template).render(context), status_code=status)


def json_response(data, status=200):
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def broker_status(exc):
    """The HTTP status for a broker error: 502 when the broker answered something the
    console did not expect."""
    return HTTP_STATUS.get(exc.code, 502)


# -- template filters ------------------------------------------------------------------------

def _num(value):
    return f"{value:,}" if isinstance(value, int) else value


def _rate(value):
    return f"{value:,.1f}" if value else "0"


def _size(value):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return value


def _quote(value):
    return quote(str(value), safe="")


def topic_path(name):
    """/ns/topic -> the console path of its page (each part quoted)."""
    return "/topics/" + "/".join(quote(p, safe="") for p in name.strip("/").split("/"))


FILTERS = {"num": _num, "rate": _rate, "size": _size, "q": _quote, "path": topic_path}
