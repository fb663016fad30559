"""Request checks at the service edge: every field a handler uses is checked here before the
handler changes anything, and a field the broker cannot take is refused with
InvalidArgument / InvalidTopicName (INVALID_ARGUMENT, through services.errors) whose message
starts with the field's name.

Why at the edge and not only in the core: protobuf hands us whatever a client put in a
well-formed message (unknown enum numbers are kept as ints, strings may be 64 KiB of
control characters), and a handler that finds out half-way, after it created a topic or
registered a consumer, leaves that state behind. The core keeps its own checks as a second
line; these are the ones a client sees.

Fields not checked here are opaque to the broker: request_id is echoed, ids are looked up
(unknown ones are NOT_FOUND), and a StreamMessage's payload, attributes, producer_name and
routing_key are message content, forwarded as sent and bounded by max_message_size."""

from danube.broker import names
from danube.broker.errors import InvalidArgument
from danube.broker.names import quote
from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.proto import DanubeApi_pb2 as pb

MAX_KEY_FILTERS = 64
MAX_KEY_FILTER_BYTES = 255
MAX_SCHEMA_SUBJECT_BYTES = 255
MAX_NACK_REASON_BYTES = 4096
# A nack may ask for a later redelivery; a message parked for longer than this (a week)
# would pin the subscription's cursor and retention in practice for ever.
MAX_NACK_DELAY_MS = 7 * 24 * 3600 * 1000

_DISPATCH = frozenset(pb.DispatchStrategy.values())
_ACCESS = frozenset(pb.ProducerAccessMode.values())
_SUB_TYPES = frozenset(pb.ConsumerRequest.SubscriptionType.values())
_ADMIN_DISPATCH = frozenset(admin_pb.DispatchStrategy.values())


def enum(value, allowed, field, enum_name):
    if value not in allowed:
        raise InvalidArgument(f"{field}: {value} is not a {enum_name} value "
                              f"({', '.join(str(v) for v in sorted(allowed))})")
    return value


def _bounded_text(value, field, limit, *, empty_ok=False):
    if not value and not empty_ok:
        raise InvalidArgument(f"{field} must not be empty")
    size = len(value.encode("utf-8"))
    if size > limit:
        raise InvalidArgument(f"{field} is {size} bytes of UTF-8, more than {limit}")
    if not value.isprintable():
        raise InvalidArgument(f"{field} {quote(value)} must not contain control characters")


# -- danube.ProducerService / ConsumerService / Discovery -----------------------------------

def producer_request(r):
    names.validate_topic(r.topic_name, "topic_name")
    names.validate_client_name(r.producer_name, "producer_name")
    enum(r.dispatch_strategy, _DISPATCH, "dispatch_strategy", "DispatchStrategy")
    enum(r.producer_access_mode, _ACCESS, "producer_access_mode", "ProducerAccessMode")
    if r.HasField("schema_ref"):
        _bounded_text(r.schema_ref.subject, "schema_ref.subject", MAX_SCHEMA_SUBJECT_BYTES)


def consumer_request(r):
    names.validate_topic(r.topic_name, "topic_name")
    names.validate_client_name(r.consumer_name, "consumer_name")
    names.validate_client_name(r.subscription, "subscription")
    enum(r.subscription_type, _SUB_TYPES, "subscription_type", "SubscriptionType")
    if len(r.key_filters) > MAX_KEY_FILTERS:
        raise InvalidArgument(f"key_filters: {len(r.key_filters)} patterns, more than "
                              f"{MAX_KEY_FILTERS}")
    for i, pattern in enumerate(r.key_filters):
        _bounded_text(pattern, f"key_filters[{i}]", MAX_KEY_FILTER_BYTES)


def ack_request(r, what):
    if not r.HasField("msg_id"):
        raise InvalidArgument(f"Error {what} message: msg_id is required")
    names.validate_topic(r.msg_id.topic_name, "msg_id.topic_name")
    names.validate_client_name(r.subscription_name, "subscription_name")


def nack_request(r):
    ack_request(r, "negatively acknowledging")
    if r.HasField("delay_ms") and r.delay_ms > MAX_NACK_DELAY_MS:
        raise InvalidArgument(f"delay_ms: {r.delay_ms} is more than {MAX_NACK_DELAY_MS} "
                              f"(7 days)")
    if r.HasField("reason"):
        _bounded_text(r.reason, "reason", MAX_NACK_REASON_BYTES, empty_ok=True)


_CLIENT_TYPES = frozenset(pb.HealthCheckRequest.ClientType.values())


def health_request(r):
    enum(r.client, _CLIENT_TYPES, "client", "health check client type")


def lookup_request(r):
    names.validate_topic(r.topic, "topic")


# -- danube_admin --------------------------------------------------------------------------

def admin_dispatch(value, field="dispatch_strategy"):
    return enum(value, _ADMIN_DISPATCH, field, "DispatchStrategy")


def new_topic_request(r):
    names.validate_topic(r.name, "name")
    admin_dispatch(r.dispatch_strategy)
    if r.HasField("schema_subject"):
        _bounded_text(r.schema_subject, "schema_subject", MAX_SCHEMA_SUBJECT_BYTES)


def partitioned_topic_request(r):
    names.validate_topic(r.base_name, "base_name")
    names.validate_partitions(r.base_name, r.partitions)
    admin_dispatch(r.dispatch_strategy)
    if r.HasField("schema_subject"):
        _bounded_text(r.schema_subject, "schema_subject", MAX_SCHEMA_SUBJECT_BYTES)


def topic_request(r):
    names.validate_topic(r.name, "name")


def namespace_request(r):
    names.validate_namespace(r.name, "name")


def subscription_request(r):
    """SubscriptionRequest and the Get/Set failure-policy and dispatch-config requests:
    ``topic`` and ``subscription``."""
    names.validate_topic(r.topic, "topic")
    names.validate_client_name(r.subscription, "subscription")


_BACKOFF = frozenset(admin_pb.SubscriptionBackoffStrategy.values())
_POISON = frozenset(admin_pb.SubscriptionPoisonPolicy.values())


def failure_policy_request(r):
    subscription_request(r)
    if not r.HasField("failure_policy"):
        raise InvalidArgument("failure_policy must be provided")
    policy = r.failure_policy
    enum(policy.backoff_strategy, _BACKOFF, "failure_policy.backoff_strategy",
         "SubscriptionBackoffStrategy")
    enum(policy.poison_policy, _POISON, "failure_policy.poison_policy",
         "SubscriptionPoisonPolicy")
    if policy.HasField("dead_letter_topic") and policy.dead_letter_topic:
        names.validate_topic(policy.dead_letter_topic, "failure_policy.dead_letter_topic")


def dispatch_config_request(r):
    subscription_request(r)
    if not r.HasField("dispatch_config"):
        raise InvalidArgument("dispatch_config is required")


def broker_id(value, field="broker_id"):
    _bounded_text(value, field, 64)
    if "/" in value:
        raise InvalidArgument(f"{field} {quote(value)} must not contain '/'")


# TopicHistory. Offsets are uint64 on the wire but never reach 2**63: a value there is a
# client's -1 (or another negative number) sent unsigned.
MAX_OFFSET = (1 << 63) - 1
MAX_READ_BATCH = 100_000


def offsets_request(r):
    names.validate_topic(r.topic, "topic")


def read_range_request(r):
    names.validate_topic(r.topic, "topic")
    for field in ("start_offset", "end_offset"):
        value = getattr(r, field)
        if value > MAX_OFFSET:
            raise InvalidArgument(f"{field}: {value} is not an offset (more than {MAX_OFFSET}"
                                  f"; a negative number sent unsigned?)")
    if r.end_offset < r.start_offset:
        raise InvalidArgument(f"end_offset {r.end_offset} is below start_offset "
                              f"{r.start_offset}")
    if r.max_messages > MAX_READ_BATCH:
        raise InvalidArgument(f"max_messages: {r.max_messages} is more than {MAX_READ_BATCH}")
