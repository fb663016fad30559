"""The core's namespaces: kept in metadata only (``keys.namespace_policy``), with the
policies each one's topics start with."""

import dataclasses

from danube.broker import names
from danube.broker.errors import NamespaceNotEmpty, NamespaceNotFound, TopicAlreadyExists
from danube.config import Policies
from danube.metadata import keys


class Namespaces:
    def __init__(self, cfg, store):
        self.cfg = cfg
        self.store = store

    async def ensure_namespace(self, ns):
        """Create ``ns`` with the broker's policies unless it exists (the bootstrap ones)."""
        key = keys.namespace_policy(ns)
        if await self.store.get_entry(key) is None:
            await self.store.put(key, dataclasses.asdict(self.cfg.policies))

    async def namespace_exists(self, ns):
        return await self.store.get_entry(keys.namespace_policy(ns)) is not None

    async def namespace_entry(self, ns):
        """The namespace's policy record (an Entry), None if the namespace does not exist:
        existence and the policies topics start with in one read."""
        return await self.store.get_entry(keys.namespace_policy(ns))

    async def list_namespaces(self):
        out = []
        for key in await self.store.keys(keys.NAMESPACES):
            parts = key.split("/")
            if len(parts) == 4 and parts[3] == "policy":
                out.append(parts[2])
        return out

    async def create_namespace(self, ns):
        names.validate_namespace(ns)
        if await self.namespace_exists(ns):
            raise TopicAlreadyExists(f"namespace {ns} already exists")
        await self.store.put(keys.namespace_policy(ns), dataclasses.asdict(self.cfg.policies))

    async def delete_namespace(self, ns):
        if not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"namespace {ns} does not exist")
        if await self.store.keys(keys.namespace_topics_prefix(ns)):
            raise NamespaceNotEmpty(f"namespace {ns} still has topics")
        await self.store.delete_prefix(keys.namespace_prefix(ns))

    async def namespace_topics(self, ns):
        if not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"namespace {ns} does not exist")
        prefix = keys.namespace_topics_prefix(ns) + "/"
        return [f"/{ns}/{k[len(prefix):].split('/', 1)[1]}"
                for k in await self.store.keys(keys.namespace_topics_prefix(ns))
                if k.startswith(prefix) and "/" in k[len(prefix):]]

    async def namespace_policies(self, ns):
        """The admin API's GetNamespacePolicies: the broker's policies with what the
        namespace's record sets."""
        names.validate_namespace(ns)
        value = await self.store.get(keys.namespace_policy(ns))
        if value is None and not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"namespace {ns} does not exist")
        policies = dataclasses.asdict(self.cfg.policies)
        if isinstance(value, dict):
            policies.update({k: v for k, v in value.items() if k in policies})
        return policies

    async def policies_for(self, topic, namespace=None):
        """The Policies a topic is served with: its own record's, else its namespace's
        (``namespace``: that record's Entry when the caller has read it already)."""
        ns, _ = keys.split_topic(topic)
        value = await self.store.get(keys.topic_policy(topic))
        if value is None:
            value = namespace.value if namespace is not None else \
                await self.store.get(keys.namespace_policy(ns))
        policies = Policies()
        for field in dataclasses.fields(Policies):
            if isinstance(value, dict) and isinstance(value.get(field.name), int):
                setattr(policies, field.name, value[field.name])
        return policies
