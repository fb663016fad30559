"""gRPC status codes and the one exception type that carries them across the stack."""

import enum


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call ended with a non-OK status. Raised by handlers (or `context.abort`) to fail a
    call with a chosen status, and raised by the client when a call fails."""

    def __init__(self, code, details="", trailing_metadata=(), *, local=False):
        self.code = StatusCode(code)
        self.details = details
        self.trailing_metadata = tuple(trailing_metadata)
        # True when this side ended the call (a size limit, a deadline, a cancel) rather
        # than the peer's status: a retry policy may judge the two differently.
        self.local = local
        super().__init__(f"{self.code.name}: {details}")


def http_status_to_grpc(status: int) -> StatusCode:
    """gRPC's mapping for responses that are not gRPC (doc/http-grpc-status-mapping.md)."""
    return {
        400: StatusCode.INTERNAL,
        401: StatusCode.UNAUTHENTICATED,
        403: StatusCode.PERMISSION_DENIED,
        404: StatusCode.UNIMPLEMENTED,
        429: StatusCode.UNAVAILABLE,
        502: StatusCode.UNAVAILABLE,
        503: StatusCode.UNAVAILABLE,
        504: StatusCode.UNAVAILABLE,
    }.get(status, StatusCode.UNKNOWN)
