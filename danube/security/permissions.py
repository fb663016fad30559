"""The permission each RPC needs, and on what (reference b.8's table; the admin and schema
registry rows as upstream's enforce_authorization calls in danube-broker/src/admin/*.rs and
broker_server/schema_registry_handler.rs).

A method missing here is refused to everyone but super admins (default deny), so a service
added later is closed until it is given a row. `None` as the permission means authentication
only (HealthCheck).

Where ours differs from upstream, on purpose:
- ReceiveMessages checks Consume on the consumer's topic (upstream: at cluster scope, so a
  principal bound to a topic could subscribe but never receive); Ack and Nack on the topic
  the message names. A cluster-wide Consume binding still covers all three.
- SendMessage checks Produce on the topic of the producer it sends through (upstream: the
  topic name the message claims, which a client can set to anything).
"""

from danube.proto import DanubeApi_pb2 as pb
from danube.security.rbac import CLUSTER, namespace, topic


class Rule:
    __slots__ = ("permission", "resource")

    def __init__(self, permission, resource):
        self.permission = permission
        self.resource = resource            # (request, core) -> Resource


def _cluster(request, core):
    return CLUSTER


def _field(name, make):
    def resource(request, core):
        value = getattr(request, name, "")
        return make(value) if value else CLUSTER
    return resource


def _producer_topic(producer_id, core, fallback=""):
    producer = core.producers.get(producer_id)
    name = producer.topic.name if producer is not None else fallback
    return topic(name) if name else CLUSTER


def _send_message(raw, core):
    # SendMessage is registered with raw bytes (client_api.py); a message that does not
    # parse is checked at cluster scope, and the handler then refuses it as malformed.
    try:
        msg = pb.StreamMessage.FromString(raw)
    except Exception:  # noqa: BLE001 - any parse failure: the handler says why
        return CLUSTER
    return _producer_topic(msg.msg_id.producer_id, core, msg.msg_id.topic_name)


def _send_messages(batch, core):
    return _producer_topic(batch.producer_id, core)


def _receive(request, core):
    consumer = core.consumers.get(request.consumer_id)
    if consumer is None:
        return CLUSTER
    return topic(consumer.subscription.topic.name)


def _acked(request, core):
    name = request.msg_id.topic_name if request.HasField("msg_id") else ""
    return topic(name) if name else CLUSTER


_TOPIC_NAME = _field("name", topic)
_TOPIC = _field("topic", topic)
_NS_NAME = _field("name", namespace)
_SUBJECT = _field("subject", topic)          # upstream: a schema subject is a topic resource
_TOPIC_NAME_FIELD = _field("topic_name", topic)


def _rows():
    rows = {}

    def add(service, permission, resource, *methods):
        for m in methods:
            rows[f"/{service}/{m}"] = Rule(permission, resource)

    add("danube.Discovery", "Lookup", _TOPIC, "TopicLookup", "TopicPartitions")
    add("danube.ProducerService", "Produce", _TOPIC_NAME_FIELD, "CreateProducer")
    add("danube.ProducerService", "Produce", _send_message, "SendMessage")
    add("danube.ConsumerService", "Consume", _TOPIC_NAME_FIELD, "Subscribe")
    add("danube.ConsumerService", "Consume", _receive, "ReceiveMessages")
    add("danube.ConsumerService", "Consume", _acked, "Ack", "Nack")
    add("danube.HealthCheck", None, _cluster, "HealthCheck")
    add("danube.StorageService", "Consume", _TOPIC, "ListSegmentDescriptors")
    # Upstream checks nothing beyond authentication here, though its Replicate permission
    # exists for it (docs/compatibility.md): ours asks Replicate on the edge's namespace,
    # and at cluster scope for the stream (a batch may name any topic).
    add("danube.edge.EdgeReplicatorService", "Replicate", _field("edge_name", namespace),
        "RegisterEdge", "EdgeHeartbeat")
    add("danube.edge.EdgeReplicatorService", "Replicate", _cluster, "ReplicateData")
    add("danube_ext.BatchProducer", "Produce", _send_messages, "SendMessages")
    add("danube_ext.BatchConsumer", "Consume", _receive, "ReceiveBatches")
    add("danube_ext.BatchConsumer", "Consume", _TOPIC_NAME_FIELD, "AckRanges")
    add("danube_ext.TopicHistory", "Consume", _TOPIC, "GetOffsets", "ReadRange")
    add("danube_ext.TopicStatsService", "ManageTopic", _TOPIC_NAME, "GetTopicStats")
    add("danube_ext.TopicStatsService", "ManageTopic", _field("namespace", namespace),
        "ListTopicStats")
    sr = "danube_schema.SchemaRegistry"
    add(sr, "ManageSchema", _SUBJECT, "RegisterSchema", "GetLatestSchema", "ListVersions",
        "CheckCompatibility", "DeleteSchemaVersion", "SetCompatibilityMode")
    add(sr, "ManageSchema", _cluster, "GetSchema", "ListSubjects")
    add(sr, "ManageSchema", _TOPIC_NAME_FIELD, "ConfigureTopicSchema",
        "UpdateTopicValidationPolicy", "GetTopicSchemaConfig")
    ba = "danube_admin.BrokerAdmin"
    add(ba, "ManageBroker", _cluster, "ListBrokers", "GetLeaderBroker", "UnloadBroker",
        "ActivateBroker")
    add(ba, "ManageNamespace", _cluster, "ListNamespaces")
    add(ba, "ManageCluster", _cluster, "GetClusterBalance", "TriggerRebalance")
    add("danube_admin.ClusterAdmin", "ManageCluster", _cluster, "ClusterStatus", "AddNode",
        "PromoteNode", "RemoveNode")
    add("danube_admin.NamespaceAdmin", "ManageNamespace", _NS_NAME, "GetNamespaceTopics",
        "GetNamespacePolicies", "CreateNamespace", "DeleteNamespace")
    ta = "danube_admin.TopicAdmin"
    add(ta, "ManageTopic", _NS_NAME, "ListNamespaceTopics")
    add(ta, "ManageTopic", _cluster, "ListBrokerTopics")
    add(ta, "ManageTopic", _TOPIC_NAME, "CreateTopic", "DeleteTopic", "UnloadTopic",
        "ListSubscriptions", "DescribeTopic")
    add(ta, "ManageTopic", _field("base_name", topic), "CreatePartitionedTopic")
    add(ta, "ManageTopic", _TOPIC, "Unsubscribe", "SetSubscriptionFailurePolicy",
        "GetSubscriptionFailurePolicy", "SetSubscriptionDispatchConfig",
        "GetSubscriptionDispatchConfig")
    add("danube_admin.SecurityAdmin", "ManageCluster", _cluster, "CreateRole", "GetRole",
        "ListRoles", "DeleteRole", "CreateBinding", "GetBinding", "ListBindings",
        "ListAllBindings", "DeleteBinding")
    return rows


RULES = _rows()
