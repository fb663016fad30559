"""The one place where broker errors become gRPC statuses (upstream's codes, reference (c))."""

import functools

from danube.broker import errors as e
from danube.rpc import RpcError, StatusCode

_CODES = {
    e.InvalidTopicName: StatusCode.INVALID_ARGUMENT,
    e.MessageTooLarge: StatusCode.INVALID_ARGUMENT,
    e.TopicNotFound: StatusCode.NOT_FOUND,
    e.ProducerNotFound: StatusCode.NOT_FOUND,
    e.ConsumerNotFound: StatusCode.NOT_FOUND,
    e.NamespaceNotFound: StatusCode.UNAVAILABLE,
    e.TopicAlreadyExists: StatusCode.ALREADY_EXISTS,
    e.DispatchMismatch: StatusCode.FAILED_PRECONDITION,
    e.ProducerLimit: StatusCode.RESOURCE_EXHAUSTED,
    e.ConsumerLimit: StatusCode.RESOURCE_EXHAUSTED,
    e.SubscriptionLimit: StatusCode.PERMISSION_DENIED,
    e.SubscribeDenied: StatusCode.PERMISSION_DENIED,
    e.PublishFailed: StatusCode.PERMISSION_DENIED,
    # Upstream answers INTERNAL here (reference (c), Ack/Nack errors): a client error
    # reported as a server fault, so ours names it as what it is.
    e.SubscriptionNotFound: StatusCode.NOT_FOUND,
    e.NamespaceNotEmpty: StatusCode.FAILED_PRECONDITION,
    e.ConsumerTakenOver: StatusCode.ABORTED,
    e.BrokerShuttingDown: StatusCode.UNAVAILABLE,
    e.StorageFailed: StatusCode.UNAVAILABLE,
    # A full disk or the descriptor limit (ours): the message names the volume and its
    # free bytes, or the limit and how to raise it; the clients retry this code.
    e.ResourceExhausted: StatusCode.RESOURCE_EXHAUSTED,
    e.InvalidPolicy: StatusCode.INVALID_ARGUMENT,
    e.InvalidArgument: StatusCode.INVALID_ARGUMENT,
    e.NotReliable: StatusCode.FAILED_PRECONDITION,
    e.OffsetOutOfRange: StatusCode.OUT_OF_RANGE,
    e.SchemaNotFound: StatusCode.NOT_FOUND,
    e.SchemaIncompatible: StatusCode.FAILED_PRECONDITION,
    e.SchemaSubjectFull: StatusCode.FAILED_PRECONDITION,
    e.SchemaRejected: StatusCode.PERMISSION_DENIED,
    e.BrokerNotFound: StatusCode.NOT_FOUND,
    e.ClusterRequired: StatusCode.FAILED_PRECONDITION,
    e.TopicUnloaded: StatusCode.UNAVAILABLE,
    e.TopicElsewhere: StatusCode.UNAVAILABLE,
}


def to_rpc_error(exc: e.BrokerError, overrides=None) -> RpcError:
    if isinstance(exc, e.PartlyPublished):
        # The status of the message that stopped the batch; the text says how far it got.
        return RpcError(to_rpc_error(exc.cause, overrides).code, str(exc))
    for cls in type(exc).__mro__:
        if overrides and cls in overrides:
            return RpcError(overrides[cls], str(exc))
        if cls in _CODES:
            return RpcError(_CODES[cls], str(exc))
    return RpcError(StatusCode.INTERNAL, str(exc))


def maps_errors(overrides=None):
    """Decorator for service methods: BrokerError -> RpcError, with per-method overrides
    where upstream answers differently (e.g. Subscribe wraps most failures as
    PERMISSION_DENIED)."""
    def wrap(fn):
        @functools.wraps(fn)
        async def method(self, request, context):
            try:
                return await fn(self, request, context)
            except e.BrokerError as exc:
                raise to_rpc_error(exc, overrides) from None
        return method
    return wrap
