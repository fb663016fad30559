"""What a reliable subscription does when a message keeps failing (reference b.6).

A policy value with no dependencies, below the configuration that reads its defaults from
YAML and the broker that applies it."""

import dataclasses

BLOCK, DROP, DEAD_LETTER = "block", "drop", "dead_letter"
FIXED, EXPONENTIAL = "fixed", "exponential"
# Upstream's JSON spellings in metadata (`…/failure_policy`).
_POISON_JSON = {BLOCK: "Block", DROP: "Drop", DEAD_LETTER: "DeadLetter"}
_BACKOFF_JSON = {FIXED: "Fixed", EXPONENTIAL: "Exponential"}


class InvalidFailurePolicy(ValueError):
    pass


@dataclasses.dataclass
class FailurePolicy:
    max_redelivery_count: int = 5
    ack_timeout_ms: int = 30_000
    base_redelivery_delay_ms: int = 1_000
    max_redelivery_delay_ms: int = 60_000
    backoff_strategy: str = EXPONENTIAL
    poison_policy: str = BLOCK
    dead_letter_topic: str | None = None

    def validate(self):
        if self.poison_policy not in _POISON_JSON:
            raise InvalidFailurePolicy(
                f"poison_policy must be block, drop or dead_letter, not {self.poison_policy!r}")
        if self.backoff_strategy not in _BACKOFF_JSON:
            raise InvalidFailurePolicy(
                f"backoff_strategy must be fixed or exponential, not {self.backoff_strategy!r}")
        if self.poison_policy == DEAD_LETTER and not (self.dead_letter_topic or "").strip():
            # Upstream's words (SubscriptionFailurePolicy::validate): it refuses it too.
            raise InvalidFailurePolicy(
                "dead_letter_topic must be configured when poison_policy is DeadLetter")
        for name in ("max_redelivery_count", "ack_timeout_ms", "base_redelivery_delay_ms",
                     "max_redelivery_delay_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidFailurePolicy(f"{name} must be a non-negative integer")
        return self

    def redelivery_delay_ms(self, attempts: int) -> int:
        """Delay before delivery attempt `attempts + 1`, after `attempts` failures."""
        if self.backoff_strategy == FIXED:
            delay = self.base_redelivery_delay_ms
        else:
            delay = self.base_redelivery_delay_ms * (2 ** max(0, attempts - 1))
        return min(delay, self.max_redelivery_delay_ms)

    def for_subscription(self, topic: str, subscription: str) -> "FailurePolicy":
        """A copy whose dead_letter_topic template ({namespace}, {topic}, {subscription})
        is filled in for one subscription."""
        policy = dataclasses.replace(self)
        if policy.dead_letter_topic:
            ns, name = topic.split("/")[1:3]
            policy.dead_letter_topic = policy.dead_letter_topic.format(
                namespace=ns, topic=name, subscription=subscription)
        return policy

    def to_json(self):
        return {"max_redelivery_count": self.max_redelivery_count,
                "ack_timeout_ms": self.ack_timeout_ms,
                "base_redelivery_delay_ms": self.base_redelivery_delay_ms,
                "max_redelivery_delay_ms": self.max_redelivery_delay_ms,
                "backoff_strategy": _BACKOFF_JSON[self.backoff_strategy],
                "dead_letter_topic": self.dead_letter_topic,
                "poison_policy": _POISON_JSON[self.poison_policy]}

    @classmethod
    def from_config(cls, tree):
        """From a YAML mapping (our `dispatch.failure_policy`); spellings are lenient
        (`dead-letter`, `DeadLetter`, `Exponential`)."""
        if tree is None:
            return cls()
        if not isinstance(tree, dict):
            raise InvalidFailurePolicy("dispatch.failure_policy must be a mapping")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(tree) - known
        if unknown:
            raise InvalidFailurePolicy(
                f"dispatch.failure_policy: unknown keys {sorted(unknown)}")
        values = dict(tree)
        if "poison_policy" in values:
            values["poison_policy"] = _normalise(values["poison_policy"])
        if "backoff_strategy" in values:
            values["backoff_strategy"] = _normalise(values["backoff_strategy"])
        return cls(**values).validate()


def _normalise(text):
    text = str(text).strip()
    out = "".join(("_" + c.lower()) if c.isupper() else c for c in text).lstrip("_")
    return out.replace("-", "_").lower()
