"""Typed client errors. Every failure the library reports is a DanubeError; the ones that
come from the broker carry its gRPC status code (`.code`), so callers can branch on the
class (or the code) instead of parsing message text."""

from danube.rpc import RpcError, StatusCode


class DanubeError(Exception):
    """Base of all client errors. `code` is the gRPC StatusCode, or None when the error was
    raised on the client side without a broker answer."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = StatusCode(code)

    @property
    def details(self):
        return str(self)


class Unavailable(DanubeError):
    """The broker could not be reached, or asked the client to retry (after the retries)."""
    code = StatusCode.UNAVAILABLE


class DeadlineExceeded(DanubeError):
    code = StatusCode.DEADLINE_EXCEEDED


class NotFound(DanubeError):
    """Unknown topic, producer or consumer."""
    code = StatusCode.NOT_FOUND


class NoTopicsFound(NotFound):
    """Client side: TopicPartitions returned nothing to subscribe to."""


class InvalidArgument(DanubeError):
    code = StatusCode.INVALID_ARGUMENT


class AlreadyExists(DanubeError):
    code = StatusCode.ALREADY_EXISTS


class PermissionDenied(DanubeError):
    code = StatusCode.PERMISSION_DENIED


class ResourceExhausted(DanubeError):
    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(DanubeError):
    """E.g. the producer's dispatch strategy does not match the topic's."""
    code = StatusCode.FAILED_PRECONDITION


class Unauthenticated(DanubeError):
    code = StatusCode.UNAUTHENTICATED


class Unimplemented(DanubeError):
    code = StatusCode.UNIMPLEMENTED


class Aborted(DanubeError):
    """E.g. a newer stream of the same consumer name took this one over."""
    code = StatusCode.ABORTED


class InternalError(DanubeError):
    code = StatusCode.INTERNAL


class ClientClosed(DanubeError):
    """The producer, consumer or client was closed."""


_BY_CODE = {cls.code: cls for cls in (
    Unavailable, DeadlineExceeded, NotFound, InvalidArgument, AlreadyExists, PermissionDenied,
    ResourceExhausted, FailedPrecondition, Unauthenticated, Unimplemented, Aborted,
    InternalError)}


def from_rpc(exc: RpcError, context=None) -> DanubeError:
    """The typed error for a failed call; `context` ("create producer on /ns/t") prefixes the
    message so a one-line report says what was being done."""
    message = f"{exc.code.name}: {exc.details}"
    if context:
        message = f"{context}: {message}"
    cls = _BY_CODE.get(exc.code, DanubeError)
    return cls(message, exc.code)
