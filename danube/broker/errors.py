"""Typed errors of the broker core. The core raises these; `danube.services.errors` is the
one place that maps them to gRPC status codes (upstream's codes, reference (c))."""

import errno

from danube.storage.errors import DescriptorLimitError, DiskFullError


class BrokerError(Exception):
    """Base of every error the core reports to a client."""


class InvalidTopicName(BrokerError):
    pass


class TopicNotFound(BrokerError):
    pass


class TopicAlreadyExists(BrokerError):
    pass


class NamespaceNotFound(BrokerError):
    pass


class NamespaceNotEmpty(BrokerError):
    pass


class ProducerNotFound(BrokerError):
    pass


class ConsumerNotFound(BrokerError):
    pass


class SubscriptionNotFound(BrokerError):
    pass


class DispatchMismatch(BrokerError):
    """The producer's dispatch strategy differs from the topic's."""


class MessageTooLarge(BrokerError):
    pass


class ProducerLimit(BrokerError):
    """max_producers_per_topic reached."""


class ConsumerLimit(BrokerError):
    """max_consumers_per_topic or max_consumers_per_subscription reached."""


class SubscriptionLimit(BrokerError):
    """max_subscriptions_per_topic reached."""


class SubscribeDenied(BrokerError):
    """The subscription refuses this consumer (e.g. a second consumer on Exclusive)."""


class PublishFailed(BrokerError):
    """The topic cannot take the message (closed, being deleted, producer detached)."""


class ConsumerTakenOver(BrokerError):
    """A newer ReceiveMessages stream of the same consumer replaced this one."""


class BrokerShuttingDown(BrokerError):
    pass


class TopicElsewhere(BrokerError):
    """Another broker serves the topic (or it is moving between brokers), as the placement
    says; the client must look it up again. `reason`: upstream's danube_client_redirects_total label,
    "not_local" (it exists and is not here) or "post_create" (just created, placed by the
    leader)."""

    def __init__(self, message, reason="not_local"):
        super().__init__(message)
        self.reason = reason


class StorageFailed(BrokerError):
    """The WAL could not take or sync a message."""


class ResourceExhausted(BrokerError):
    """The broker is out of something an operator gives back: disk space (``DiskFull``) or
    file descriptors (``DescriptorLimit``). The message names the volume and its free
    bytes, or the limit and how to raise it; nothing of the refused request was kept, and
    the same request succeeds once the resource is back."""


class DiskFull(ResourceExhausted):
    """The WAL's volume is full (ENOSPC, or its quota: EDQUOT)."""


class DescriptorLimit(ResourceExhausted):
    """The broker's descriptor limit (RLIMIT_NOFILE) or the system's file table is full."""


def storage_error(exc, doing):
    """The BrokerError for a storage failure ``exc`` (a ``WALError`` or an OSError) while
    ``doing`` (e.g. "could not store the messages on /ns/t"): ``DiskFull`` or
    ``DescriptorLimit`` when a resource ran out, else ``StorageFailed``."""
    if isinstance(exc, DiskFullError):
        return DiskFull(f"{doing}: {exc}")
    if isinstance(exc, DescriptorLimitError):
        return DescriptorLimit(f"{doing}: {exc}")
    if isinstance(exc, OSError):
        return StorageFailed(f"{doing}: {exc.strerror or exc} "
                             f"({errno.errorcode.get(exc.errno, exc.errno)})")
    return StorageFailed(f"{doing}: {exc}")


class InvalidPolicy(BrokerError):
    pass


class InvalidArgument(BrokerError):
    """A request field the broker cannot take (a name, an enum value, a count); the message
    names the field. Raised before the request changes anything."""


class PartlyPublished(BrokerError):
    """A non-reliable batch stopped at a message that failed (``cause``) after ``published``
    of its ``total`` messages went out; the client is told both, with the cause's status."""

    def __init__(self, cause, published, total):
        super().__init__(f"{cause} ({published} of {total} messages in the batch were "
                         f"published)")
        self.cause = cause
        self.published = published
        self.total = total


class NotReliable(BrokerError):
    """The operation needs a reliable topic (one that keeps its messages): offset-addressed
    reads (danube_ext.TopicHistory) of a non-reliable topic."""


class OffsetOutOfRange(BrokerError):
    """Part of the offsets asked for is gone from every tier (local retention deleted it and
    no durable tier holds it); the message names the missing range and the earliest kept."""


class SchemaNotFound(BrokerError):
    """No such schema subject, schema id or version in the registry."""


class SchemaIncompatible(BrokerError):
    """A new schema version breaks the subject's compatibility mode with a version it
    keeps; the message lists each rule it breaks."""


class SchemaSubjectFull(BrokerError):
    """A new version would make a subject's record larger than one metadata record may be
    (etcd refuses requests over 1.5 MiB by default)."""


class SchemaRejected(BrokerError):
    """A message refused by its topic's schema validation (policy enforce): wrong or missing
    schema_id, unknown schema_version, or a payload the schema does not accept."""


class BrokerNotFound(BrokerError):
    """No broker with this id is registered."""


class ClusterRequired(BrokerError):
    """The operation moves topics to another broker, and there is only this one."""


class TopicUnloaded(BrokerError):
    """The topic was unloaded by an admin; its clients look it up and connect again."""
