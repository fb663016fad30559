"""The console's two forms, read and checked before anything is sent: a field that cannot be
what the broker expects (a partition count that is not a number, a topic name with too many
slashes) comes back to the form with a message naming it, as the broker's errors do."""

from danube.proto import DanubeAdmin_pb2 as adm

BACKOFF = {"fixed": adm.Fixed, "exponential": adm.Exponential}
POISON = {"dead_letter": adm.DeadLetter, "dead-letter": adm.DeadLetter, "block": adm.Block,
          "drop": adm.Drop}
POLICY_NUMBERS = (("max_redelivery_count", 2**32 - 1), ("ack_timeout_ms", 2**64 - 1),
                  ("base_redelivery_delay_ms", 2**64 - 1),
                  ("max_redelivery_delay_ms", 2**64 - 1))


class FormError(ValueError):
    """A field that cannot be sent as it is; the message names it."""


def topic_name(name, namespace):
    """/namespace/topic from the form's name ("orders" or "/ns/orders") and namespace."""
    name = name.strip()
    namespace = namespace.strip().strip("/") or "default"
    if not name:
        raise FormError("topic name: required")
    if name.startswith("/"):
        parts = name[1:].split("/")
        if len(parts) != 2 or not all(parts):
            raise FormError(f"topic name {name!r}: a full name is /namespace/topic")
        return name
    if "/" in name:
        raise FormError(f"topic name {name!r}: give the topic alone or /namespace/topic")
    if "/" in namespace:
        raise FormError(f"namespace {namespace!r}: no '/' inside a namespace")
    return f"/{namespace}/{name}"


def create_topic(form):
    """CreateTopic's arguments: {name, partitions, reliable, schema_subject}."""
    partitions = _number(form.get("partitions", ""), "partitions", 0, 2**32 - 1, default=0)
    dispatch = form.get("dispatch_strategy", "non_reliable").strip().lower().replace("-", "_")
    if dispatch not in ("reliable", "non_reliable"):
        raise FormError(f"dispatch strategy {dispatch!r}: reliable or non_reliable")
    return {"name": topic_name(form.get("name", ""), form.get("namespace", "")),
            "partitions": partitions, "reliable": dispatch == "reliable",
            "schema_subject": form.get("schema_subject", "").strip() or None}


def failure_policy(form):
    """SubscriptionFailurePolicy's fields, enums by value."""
    policy = {name: _number(form.get(name, ""), name.replace("_", " "), 0, top)
              for name, top in POLICY_NUMBERS}
    backoff = form.get("backoff_strategy", "fixed").strip().lower()
    if backoff not in BACKOFF:
        raise FormError(f"backoff strategy {backoff!r}: fixed or exponential")
    poison = form.get("poison_policy", "").strip().lower()
    if poison not in POISON:
        raise FormError(f"poison policy {poison!r}: dead_letter, block or drop")
    policy["backoff_strategy"] = BACKOFF[backoff]
    policy["poison_policy"] = POISON[poison]
    dead_letter = form.get("dead_letter_topic", "").strip()
    if dead_letter:
        policy["dead_letter_topic"] = dead_letter
    return policy


def _number(text, field, low, high, default=None):
    text = text.strip()
    if not text and default is not None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise FormError(f"{field}: {text!r} is not a whole number") from None
    if not low <= value <= high:
        raise FormError(f"{field}: {value} is out of range ({low}..{high})")
    return value
