"""Topic and partition names (reference (c)).

Upstream's `validate_topic_format` splits on '/' and requires exactly three parts made of
Unicode alphanumerics, '_' or '-'. It accepts an empty namespace or topic (`//t`) and a
non-empty first part (`x/ns/t`). We keep the character rules and the three-part shape but, as
a deliberate choice, require the canonical `/namespace/topic` form with both parts non-empty:
`//t` and `x/ns/t` name nothing a client can use, and accepting them would create keys such
as `/namespaces//topics//t` in the metadata. Such names get INVALID_ARGUMENT.
"""

import re

from danube.broker.errors import InvalidTopicName

PARTITION_SEP = "-part-"
_PARTITION_RE = re.compile(r"^(.*)-part-(\d+)$")
MAX_NAME = 512


def _valid_part(part: str) -> bool:
    return bool(part) and all(c.isalnum() or c in "_-" for c in part)


def validate_topic(name: str) -> tuple[str, str]:
    """Return (namespace, topic) of a `/namespace/topic` name, or raise InvalidTopicName."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicName("topic name is empty")
    if len(name) > MAX_NAME:
        raise InvalidTopicName(f"topic name longer than {MAX_NAME} characters")
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "":
        raise InvalidTopicName(
            f"invalid topic name {name!r}: expected /namespace/topic")
    _, ns, topic = parts
    for what, part in (("namespace", ns), ("topic", topic)):
        if not _valid_part(part):
            raise InvalidTopicName(
                f"invalid topic name {name!r}: the {what} must be non-empty and use only "
                f"letters, digits, '_' or '-'")
    return ns, topic


def partition_name(topic: str, index: int) -> str:
    return f"{topic}{PARTITION_SEP}{index}"


def split_partition(topic: str) -> tuple[str, int] | None:
    """(base topic, partition index) for a partition's name, else None."""
    m = _PARTITION_RE.match(topic)
    if m is None:
        return None
    return m.group(1), int(m.group(2))
