"""The connector's errors: each names what is wrong (the option, the topic, the broker)."""

import grpc


class DanubeSparkError(Exception):
    """Any error of the connector; Spark shows its message in the failed query's error.
    ``code``: the gRPC status's name when a broker call failed (the owner routing retries
    by it), else None."""

    code = None


class OptionError(DanubeSparkError, ValueError):
    """A missing or malformed option."""


class TopicNotFound(DanubeSparkError):
    pass


class NotReliable(DanubeSparkError):
    pass


class BrokerUnreachable(DanubeSparkError):
    pass


class DataLoss(DanubeSparkError):
    pass


class PublishFailed(DanubeSparkError):
    pass


def from_rpc(exc, what, topic, service_url):
    """A DanubeSparkError for a failed gRPC call, saying which topic and broker it was."""
    err = _from_rpc(exc, what, topic, service_url)
    code = exc.code() if hasattr(exc, "code") else None
    err.code = code.name if code is not None else None
    return err


def _from_rpc(exc, what, topic, service_url):
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.NOT_FOUND:
        return TopicNotFound(f"topic {topic} not found on the Danube broker at {service_url} "
                             f"({details})")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return NotReliable(f"topic {topic} is not a reliable topic, so it has no offsets to "
                           f"read: use a reliable topic ({details})")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return BrokerUnreachable(f"cannot reach the Danube broker at service_url "
                                 f"{service_url} for {what} of {topic}: {details}")
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return DataLoss(f"{what} of {topic}: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return DanubeSparkError(f"the Danube broker at {service_url} does not serve "
                                f"offset-addressed reads (danube_ext.TopicHistory), needed "
                                f"for {what} of {topic} ({details})")
    name = code.name if code is not None else type(exc).__name__
    return DanubeSparkError(f"{what} of {topic} on the Danube broker at {service_url} "
                            f"failed: {name}: {details}")
