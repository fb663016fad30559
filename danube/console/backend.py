"""What the console's pages show, from the broker's admin API: each method makes its calls
through an AdminClient (concurrently where a page needs several) and returns plain dicts and
lists, so the templates and the JSON endpoints share one shape. List answers are cached for
the TTL; writes clear the cache, so a created topic shows on the next page."""

import asyncio
import json

from danube.client import errors
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext
from danube.proto import SchemaRegistry_pb2 as sr

from danube.console.cache import TtlCache

BACKOFF = {adm.Fixed: "fixed", adm.Exponential: "exponential"}
POISON = {adm.DeadLetter: "dead_letter", adm.Block: "block", adm.Drop: "drop"}


class Backend:
    def __init__(self, admin, cache_ttl=3.0):
        self.admin = admin
        self.endpoint = admin.endpoint
        self.cache = TtlCache(cache_ttl)

    async def _cached(self, key, service, method, request, what):
        return await self.cache.get(
            key, lambda: self.admin.call(service, method, request, what=what))

    async def close(self):
        await self.admin.close()

    # -- reads ------------------------------------------------------------------------------

    async def overview(self):
        """Brokers, the leader, every namespace with its topic count, rate and backlog."""
        brokers, leader, namespaces, stats = await asyncio.gather(
            self._cached("brokers", "BrokerAdmin", "ListBrokers", None, "list brokers"),
            self._cached("leader", "BrokerAdmin", "GetLeaderBroker", None, "get leader"),
            self._cached("namespaces", "BrokerAdmin", "ListNamespaces", None,
                         "list namespaces"),
            self._topic_stats(""))
        by_ns = {ns: {"name": ns, "topics": 0, "msg_rate_in": 0.0, "backlog": 0,
                      "producers": 0, "consumers": 0} for ns in namespaces.namespaces}
        for t in stats:
            ns = by_ns.setdefault(t["namespace"], {
                "name": t["namespace"], "topics": 0, "msg_rate_in": 0.0, "backlog": 0,
                "producers": 0, "consumers": 0})
            ns["topics"] += 1
            ns["msg_rate_in"] += t["msg_rate_in"]
            ns["backlog"] += t["backlog"]
            ns["producers"] += t["producers"]
            ns["consumers"] += t["consumers"]
        return {
            "brokers": [{
                "broker_id": b.broker_id, "broker_addr": b.broker_addr,
                "admin_addr": b.admin_addr, "metrics_addr": b.metrics_addr,
                "broker_role": b.broker_role, "broker_status": b.broker_status,
                "leader": b.broker_id == leader.leader} for b in brokers.brokers],
            "leader": leader.leader,
            "namespaces": sorted(by_ns.values(), key=lambda n: n["name"]),
            "totals": totals(stats),
        }

    async def namespace_topics(self, namespace):
        """Every topic of a namespace with its counters, in name order."""
        return await self._topic_stats(namespace)

    async def _topic_stats(self, namespace):
        async def load():
            resp = await self.admin.call(
                "TopicStatsService", "ListTopicStats",
                ext.ListTopicStatsRequest(namespace=namespace),
                what=f"list topics of {namespace or 'every namespace'}")
            return [topic_row(t) for t in resp.topics]
        return await self.cache.get(("topic-stats", namespace), load)

    async def topic(self, name):
        """A topic's describe (a partitioned topic's base name has none: None) and the
        stats of the topic or of each of its partitions."""
        describe, stats = await asyncio.gather(
            self.admin.call("TopicAdmin", "DescribeTopic", adm.DescribeTopicRequest(name=name),
                            what=f"describe topic {name}"),
            self.admin.call("TopicStatsService", "GetTopicStats",
                            ext.TopicStatsRequest(name=name), what=f"stats of topic {name}"),
            return_exceptions=True)
        if isinstance(stats, BaseException):
            raise stats
        if isinstance(describe, errors.DanubeError) and len(stats.topics) > 1:
            describe = None         # a partitioned topic's base name: its partitions describe
        elif isinstance(describe, BaseException):
            raise describe
        return {
            "name": name,
            "describe": describe_dict(describe) if describe is not None else None,
            "partitions": [topic_detail(t) for t in stats.topics],
        }

    async def subscription(self, topic, subscription):
        """One subscription's stats and its failure policy (None: not set, or the topic is
        not reliable: ``policy_error`` says why)."""
        info = await self.topic(topic)
        part = info["partitions"][0] if len(info["partitions"]) == 1 else None
        stats = None
        if part is not None:
            stats = next((s for s in part["subscriptions"] if s["name"] == subscription), None)
        policy, policy_error, sub_type = None, None, None
        try:
            resp = await self.admin.call(
                "TopicAdmin", "GetSubscriptionFailurePolicy",
                adm.GetSubscriptionFailurePolicyRequest(topic=topic, subscription=subscription),
                what=f"failure policy of {subscription} on {topic}")
            sub_type = resp.subscription_type
            if resp.HasField("failure_policy"):
                policy = policy_dict(resp.failure_policy)
        except errors.DanubeError as exc:
            if stats is None:
                raise
            policy_error = str(exc)
        return {"topic": info, "name": subscription, "stats": stats, "policy": policy,
                "policy_error": policy_error, "subscription_type": sub_type}

    async def subjects(self):
        resp = await self._cached("subjects", "SchemaRegistry", "ListSubjects",
                                  sr.ListSubjectsRequest(), "list schema subjects")
        return [{"subject": s.subject, "schema_type": s.schema_type,
                 "latest_version": s.latest_version, "compatibility_mode": s.compatibility_mode,
                 "schema_id": s.schema_id, "tags": list(s.tags)} for s in resp.subjects]

    async def subject(self, subject, version=None):
        """A subject's versions and one version's definition (the latest by default)."""
        versions = (await self.admin.call(
            "SchemaRegistry", "ListVersions", sr.ListVersionsRequest(subject=subject),
            what=f"versions of subject {subject}")).versions
        if not versions:
            raise errors.NotFound(f"subject {subject} has no versions")
        rows = [{"version": v.version, "created_at": v.created_at, "created_by": v.created_by,
                 "description": v.description, "fingerprint": v.fingerprint,
                 "schema_id": v.schema_id} for v in versions]
        if version is None:
            version = max(v.version for v in versions)
        schema = await self.admin.call(
            "SchemaRegistry", "GetSchema",
            sr.GetSchemaRequest(schema_id=versions[0].schema_id, version=version),
            what=f"schema {subject} version {version}")
        return {"subject": subject, "versions": rows, "schema": {
            "version": schema.version, "schema_id": schema.schema_id,
            "schema_type": schema.schema_type,
            "definition": readable_definition(schema.schema_definition),
            "description": schema.description, "fingerprint": schema.fingerprint,
            "compatibility_mode": schema.compatibility_mode, "tags": list(schema.tags),
            "created_by": schema.created_by, "created_at": schema.created_at}}

    # -- writes -----------------------------------------------------------------------------

    async def create_topic(self, name, partitions=0, reliable=False, schema_subject=None):
        """``name`` is /namespace/topic; ``partitions`` > 0 makes a partitioned topic."""
        dispatch = adm.Reliable if reliable else adm.NonReliable
        extra = {"schema_subject": schema_subject} if schema_subject else {}
        try:
            if partitions:
                await self.admin.call("TopicAdmin", "CreatePartitionedTopic",
                                      adm.PartitionedTopicRequest(
                                          base_name=name, partitions=partitions,
                                          dispatch_strategy=dispatch, **extra),
                                      what=f"create topic {name}")
            else:
                await self.admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
                    name=name, dispatch_strategy=dispatch, **extra),
                    what=f"create topic {name}")
        finally:
            self.cache.clear()

    async def unsubscribe(self, topic, subscription):
        try:
            await self.admin.call("TopicAdmin", "Unsubscribe", adm.SubscriptionRequest(
                topic=topic, subscription=subscription),
                what=f"unsubscribe {subscription} from {topic}")
        finally:
            self.cache.clear()

    async def set_failure_policy(self, topic, subscription, policy):
        """``policy``: the fields of SubscriptionFailurePolicy, enums by their enum value."""
        await self.admin.call("TopicAdmin", "SetSubscriptionFailurePolicy",
                              adm.SetSubscriptionFailurePolicyRequest(
                                  topic=topic, subscription=subscription,
                                  failure_policy=adm.SubscriptionFailurePolicy(**policy)),
                              what=f"set failure policy of {subscription} on {topic}")


# -- messages to dicts -------------------------------------------------------------------------

def topic_row(t):
    """A line of a topic table: ListTopicStats' fields (10,000 of them per call, so kept flat
    and cheap)."""
    name = t.name
    return {
        "name": name, "namespace": name.split("/", 2)[1] if name.count("/") >= 2 else "",
        "delivery": t.delivery, "broker_id": t.broker_id, "messages_in": t.messages_in,
        "bytes_in": t.bytes_in, "msg_rate_in": t.msg_rate_in, "byte_rate_in": t.byte_rate_in,
        "producers": t.producers, "consumers": t.consumers,
        "subscriptions": t.subscription_count, "backlog": t.backlog,
        "schema_subject": t.schema_subject if t.HasField("schema_subject") else None,
    }


def topic_detail(t):
    row = topic_row(t)
    log = t.log if t.HasField("log") else None
    row["log"] = None if log is None else {
        f.name: getattr(log, f.name) for f in ext.LogStats.DESCRIPTOR.fields}
    row["subscription_count"] = row["subscriptions"]
    row["subscriptions"] = [{
        "name": s.name, "type": s.type, "consumers": s.consumers, "backlog": s.backlog,
        "unacked": s.unacked, "redelivered": s.redelivered, "cursor": s.cursor,
        "messages_out": s.messages_out, "msg_rate_out": s.msg_rate_out,
        "consumer_list": [{"consumer_id": c.consumer_id, "name": c.name,
                           "connected": c.connected, "messages_out": c.messages_out,
                           "bytes_out": c.bytes_out, "dropped": c.dropped}
                          for c in s.consumer_list],
    } for s in t.subscriptions]
    return row


def describe_dict(d):
    out = {"name": d.name, "broker_id": d.broker_id, "delivery": d.delivery,
           "subscriptions": list(d.subscriptions)}
    for field in ("schema_subject", "schema_id", "schema_version", "schema_type",
                  "compatibility_mode"):
        out[field] = getattr(d, field) if d.HasField(field) else None
    return out


def policy_dict(p):
    return {
        "max_redelivery_count": p.max_redelivery_count, "ack_timeout_ms": p.ack_timeout_ms,
        "base_redelivery_delay_ms": p.base_redelivery_delay_ms,
        "max_redelivery_delay_ms": p.max_redelivery_delay_ms,
        "backoff_strategy": BACKOFF.get(p.backoff_strategy, str(p.backoff_strategy)),
        "dead_letter_topic": p.dead_letter_topic if p.HasField("dead_letter_topic") else None,
        "poison_policy": POISON.get(p.poison_policy, str(p.poison_policy)),
    }


def readable_definition(raw):
    """The schema text inside GetSchemaResponse.schema_definition, which is upstream's
    serde-JSON SchemaDefinition ({"JsonSchema": {"raw_schema": ...}}, "String", ...); a JSON
    schema text (Avro, JSON Schema) indented for reading."""
    text = raw.decode("utf-8", "replace")
    try:
        wrapped = json.loads(text)
    except ValueError:
        return text
    if isinstance(wrapped, str):
        return f"({wrapped.lower()}: no definition)"
    if not isinstance(wrapped, dict) or len(wrapped) != 1:
        return text
    inner = next(iter(wrapped.values()))
    body = inner.get("raw_schema", inner.get("raw_proto")) if isinstance(inner, dict) else None
    if body is None:
        return text
    try:
        return json.dumps(json.loads(body), indent=2)
    except ValueError:
        return body


def totals(rows):
    return {"topics": len(rows),
            "msg_rate_in": sum(r["msg_rate_in"] for r in rows),
            "backlog": sum(r["backlog"] for r in rows),
            "messages_in": sum(r["messages_in"] for r in rows),
            "producers": sum(r["producers"] for r in rows),
            "consumers": sum(r["consumers"] for r in rows),
            "subscriptions": sum(r["subscriptions"] for r in rows)}
