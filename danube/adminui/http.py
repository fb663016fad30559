"""Answers of the UI API: JSON bodies, upstream's mapping of a broker's gRPC status to an
HTTP status (server/http.rs map_error), and reading a JSON request body with a size cap."""

import json
from datetime import datetime, timezone

from starlette.responses import JSONResponse

from danube.rpc import StatusCode

# The largest action body a UI sends is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024

_HTTP_OF = {
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.UNAUTHENTICATED: 401,
    StatusCode.PERMISSION_DENIED: 403,
    StatusCode.NOT_FOUND: 404,
    StatusCode.DEADLINE_EXCEEDED: 504,
}


class BadRequest(Exception):
    """A request the API refuses before calling the broker: (status, message)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def now():
    """RFC 3339 with the UTC offset, as chrono's to_rfc3339."""
    return datetime.now(timezone.utc).isoformat()


def ok(body, status=200):
    return JSONResponse(body, status)


def code_name(code):
    """tonic's Code as upstream prints it (Debug): NOT_FOUND -> NotFound."""
    return "".join(part.capitalize() for part in StatusCode(code).name.split("_"))


def broker_message(exc):
    """The broker's own message of a DanubeError, without the client's "CODE: " prefix."""
    text = str(exc)
    code = getattr(exc, "code", None)
    prefix = f"{StatusCode(code).name}: " if code is not None else None
    return text[len(prefix):] if prefix and text.startswith(prefix) else text


def map_error(exc):
    """A DanubeError as upstream's map_error: the HTTP status of its gRPC code (502 for
    the rest) and {"error", "code"}."""
    code = getattr(exc, "code", None)
    if code is None:
        return JSONResponse({"error": str(exc)}, 502)
    return JSONResponse({"error": broker_message(exc), "code": code_name(code)},
                        _HTTP_OF.get(code, 502))


async def json_body(request, fields):
    """The request's JSON object, checked against `fields` ({name: (types, required)}):
    415 without a JSON content type, 413 above MAX_BODY_BYTES, 400 for bad JSON, 422 for a
    missing or mistyped field (axum's Json rejections)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not (ctype == "application/json" or ctype.endswith("+json")):
        raise BadRequest(415, "Expected request with `Content-Type: application/json`")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise BadRequest(413, f"request body larger than {MAX_BODY_BYTES} bytes")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise BadRequest(400, f"Failed to parse the request body as JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest(422, "Failed to deserialize the JSON body: expected an object")
    for name, (types, required) in fields.items():
        value = doc.get(name)
        if value is None:
            if required:
                raise BadRequest(422, f"Failed to deserialize the JSON body: missing field "
                                      f"`{name}`")
            continue
        if not _is(value, types):
            raise BadRequest(422, f"Failed to deserialize the JSON body: `{name}` has the "
                                  f"wrong type (expected {_type_names(types)})")
    return doc


def _is(value, types):
    for t in types:
        if t is int:
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
                    and value < 2 ** 32:
                return True
        elif t is list:
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return True
        elif isinstance(value, t) and not (t is not bool and isinstance(value, bool)):
            return True
    return False


def _type_names(types):
    names = {int: "a whole number from 0 to 4294967295", str: "a string", bool: "true or false",
             list: "a list of strings"}
    return " or ".join(names[t] for t in types)
