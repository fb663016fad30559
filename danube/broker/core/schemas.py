"""The core's topic schema bindings: a topic bound to a registry subject (by its first
producer with a schema_ref, or by ConfigureTopicSchema), its validation policy, and the
SchemaGate each served topic applies on publish. Kept at ``keys.topic_schema_config`` (one
key, upstream's value shape), so a restarted broker binds its topics again. Which served
topics a name stands for is the topic table's answer."""

from danube.broker import names
from danube.broker.errors import DispatchMismatch, InvalidArgument, SchemaNotFound
from danube.broker.schemas.gate import POLICIES, SchemaGate
from danube.metadata import keys

_POLICY_OF_STORED = {"none": "none", "warn": "warn", "enforce": "enforce"}


def normalize_policy(policy, field="validation_policy"):
    text = (policy or "").strip().lower()
    if text not in POLICIES:
        raise InvalidArgument(f"{field}: {policy!r} is not a validation policy (none, warn, "
                              f"enforce)")
    return text


class TopicSchemas:
    def __init__(self, store, schemas, *, topic_table):
        self.store = store
        self.schemas = schemas              # SchemaRegistry
        self.topic_table = topic_table      # TopicTable

    async def load_binding(self, topic):
        """A topic served again from metadata takes its recorded binding back."""
        cfg = await self.store.get(keys.topic_schema_config(topic.name))
        if isinstance(cfg, dict) and cfg.get("subject"):
            policy = _POLICY_OF_STORED.get(str(cfg.get("validation_policy", "none")).lower(),
                                           "none")
            topic.schema = SchemaGate(self.schemas, topic.name, cfg["subject"], policy,
                                      bool(cfg.get("enable_payload_validation")))

    async def _save_topic_schema(self, topic, gate):
        await self.store.put(keys.topic_schema_config(topic.name), gate.config())
        await self.store.put(keys.topic_schema_subject(topic.name), gate.subject)
        old = topic.schema
        if old is not None:
            # The counters are the topic's (Prometheus counters), not the configuration's.
            gate.checked, gate.failures = old.checked, old.failures
        topic.schema = gate

    async def check_producer_subject(self, subject):
        """A producer's schema_ref must name a registered subject (before anything is
        created for it)."""
        if await self.schemas.find_subject(subject, "schema_ref.subject") is None:
            raise DispatchMismatch(f"schema subject {names.quote(subject)} is not registered; "
                                   f"register it first")

    async def bind_producer_subject(self, topic, subject):
        """First-producer privilege: an unbound topic takes the producer's subject; a bound
        one must be bound to it."""
        gate = topic.schema
        if gate is None:
            await self._save_topic_schema(topic, SchemaGate(self.schemas, topic.name, subject))
        elif gate.subject != subject:
            raise DispatchMismatch(f"topic {topic.name} is bound to schema subject "
                                   f"{names.quote(gate.subject)}, not "
                                   f"{names.quote(subject)}")

    async def configure_topic_schema(self, name, subject, policy, payloads):
        policy = normalize_policy(policy)
        if await self.schemas.find_subject(subject, "schema_subject") is None:
            raise SchemaNotFound(f"schema subject {subject!r} not found in the registry")
        topics = await self.topic_table.served_parts(name)
        for topic in topics:
            await self._save_topic_schema(
                topic, SchemaGate(self.schemas, topic.name, subject, policy, payloads))
        return (f"topic {name} bound to schema subject {subject!r} (validation {policy}, "
                f"payload validation {'on' if payloads else 'off'})")

    async def update_validation_policy(self, name, policy, payloads):
        policy = normalize_policy(policy)
        topics = await self.topic_table.served_parts(name)
        unbound = [t.name for t in topics if t.schema is None]
        if unbound:
            raise DispatchMismatch(f"topic {unbound[0]} has no schema subject; bind one first "
                                   f"(ConfigureTopicSchema)")
        for topic in topics:
            await self._save_topic_schema(
                topic, SchemaGate(self.schemas, topic.name, topic.schema.subject, policy,
                                  payloads))
        return (f"validation policy of {name} set to {policy} (payload validation "
                f"{'on' if payloads else 'off'})")

    async def topic_schema_config(self, name):
        """(subject, policy, payload validation, schema_id) of a topic ("" / none / False / 0
        when unbound)."""
        topic = (await self.topic_table.served_parts(name))[0]
        gate = topic.schema
        if gate is None:
            return "", "none", False, 0
        try:
            schema_id = await self.schemas.schema_id_of(gate.subject)
        except SchemaNotFound:
            schema_id = 0
        return gate.subject, gate.policy, gate.payloads, schema_id
