"""Topic and partition names (reference (c)).

Upstream's `validate_topic_format` splits on '/' and requires exactly three parts made of
Unicode alphanumerics, '_' or '-'. It accepts an empty namespace or topic (`//t`) and a
non-empty first part (`x/ns/t`). We keep the character rules and the three-part shape but, as
a deliberate choice, require the canonical `/namespace/topic` form with both parts non-empty:
`//t` and `x/ns/t` name nothing a client can use, and accepting them would create keys such
as `/namespaces//topics//t` in the metadata. Such names get INVALID_ARGUMENT.

Length limits come from where a name ends up. A reliable topic's WAL lives in the directory
`{wal_root}/{namespace}/{topic}` (the segments are used as they are, no escaping), and a stale
local WAL is moved aside to `{topic}.stale-{unix time}` (storage/topic_log.py), so each of the two
segments is limited to 255 - 17 = 238 bytes of UTF-8: the 255-byte file name limit of every
common filesystem, less that suffix. The limit applies to non-reliable topics too, since the
same name can become a reliable topic later. Partitions append `-part-N` to the topic
segment, so a partitioned topic's base name leaves room for that suffix.
"""

import re

from danube.broker.errors import InvalidArgument, InvalidTopicName

PARTITION_SEP = "-part-"
_PARTITION_RE = re.compile(r"^(.*)-part-(\d+)$")
NAME_MAX = 255                                   # bytes in one file name (ext4, xfs, btrfs)
STALE_SUFFIX_BYTES = len(".stale-") + 10         # topic_log.py's aside name, 10-digit time
MAX_SEGMENT_BYTES = NAME_MAX - STALE_SUFFIX_BYTES
MAX_NAME = 1 + MAX_SEGMENT_BYTES + 1 + MAX_SEGMENT_BYTES
# Producer, consumer and subscription names: metadata key segments, never file names, but
# they travel in status messages and logs, so they are bounded like a file name.
MAX_CLIENT_NAME_BYTES = 255
MAX_PARTITIONS = 1024
# How much of a refused value a status message quotes: the status travels in a trailer, and
# clients refuse trailers above 8-16 KiB, which would hide the real error behind another one.
_QUOTE = 80


def quote(value) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE else f"{text[:_QUOTE]}... ({len(value)} characters)"


def _valid_part(part: str) -> bool:
    return bool(part) and all(c.isalnum() or c in "_-" for c in part)


def _check_segment(field, name, what, part):
    if not _valid_part(part):
        raise InvalidTopicName(
            f"{field}: invalid topic name {quote(name)}: the {what} must be non-empty and use "
            f"only letters, digits, '_' or '-'")
    size = len(part.encode("utf-8"))
    if size > MAX_SEGMENT_BYTES:
        raise InvalidTopicName(
            f"{field}: invalid topic name {quote(name)}: the {what} is {size} bytes of UTF-8, "
            f"more than {MAX_SEGMENT_BYTES} (it names a directory of the reliable-topic WAL)")


def validate_topic(name: str, field: str = "topic_name") -> tuple[str, str]:
    """Return (namespace, topic) of a `/namespace/topic` name, or raise InvalidTopicName
    (whose message starts with `field`, the request field that held the name)."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicName(f"{field}: topic name is empty")
    if len(name) > MAX_NAME:
        raise InvalidTopicName(f"{field}: topic name {quote(name)} longer than {MAX_NAME} "
                               f"characters")
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "":
        raise InvalidTopicName(
            f"{field}: invalid topic name {quote(name)}: expected /namespace/topic")
    _, ns, topic = parts
    _check_segment(field, name, "namespace", ns)
    _check_segment(field, name, "topic", topic)
    return ns, topic


def validate_namespace(name: str, field: str = "name") -> str:
    """A namespace is the first segment of its topics' names, so it obeys the same rules
    (upstream does not check namespace names at all; one a topic cannot name is useless)."""
    if not isinstance(name, str) or not _valid_part(name):
        raise InvalidArgument(
            f"{field}: invalid namespace name {quote(name)}: it must be non-empty and use only "
            f"letters, digits, '_' or '-'")
    size = len(name.encode("utf-8"))
    if size > MAX_SEGMENT_BYTES:
        raise InvalidArgument(f"{field}: namespace name is {size} bytes of UTF-8, more than "
                              f"{MAX_SEGMENT_BYTES}")
    return name


def validate_client_name(name: str, field: str) -> str:
    """Producer, consumer and subscription names: non-empty, at most 255 bytes of UTF-8, no
    '/' (each is one segment of a metadata key such as
    `/topics/{ns}/{topic}/subscriptions/{subscription}`), and no control characters (they
    end up in logs and status messages)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{field} must not be empty")
    size = len(name.encode("utf-8"))
    if size > MAX_CLIENT_NAME_BYTES:
        raise InvalidArgument(f"{field} is {size} bytes of UTF-8, more than "
                              f"{MAX_CLIENT_NAME_BYTES}")
    if "/" in name:
        raise InvalidArgument(f"{field} {quote(name)} must not contain '/'")
    if not name.isprintable():
        raise InvalidArgument(f"{field} {quote(name)} must not contain control characters")
    return name


def validate_partitions(base: str, partitions: int, field: str = "partitions") -> None:
    """A partitioned topic's count, and its last partition's name (the longest) checked
    against the segment limit, before any partition is created."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidArgument(f"{field}: a partitioned topic has 1 to {MAX_PARTITIONS} "
                              f"partitions, not {partitions}")
    validate_topic(partition_name(base, partitions - 1), "base_name")


def partition_name(topic: str, index: int) -> str:
    return f"{topic}{PARTITION_SEP}{index}"


def split_partition(topic: str) -> tuple[str, int] | None:
    """(base topic, partition index) for a partition's name, else None."""
    m = _PARTITION_RE.match(topic)
    if m is None:
        return None
    return m.group(1), int(m.group(2))
