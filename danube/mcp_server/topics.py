"""Topic tools (upstream's tools/topics.rs): list, describe, create, delete, subscriptions,
unload, the topic's schema configuration and a subscription's failure policy."""

from typing import Annotated, Optional

from pydantic import Field

from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr

from danube.mcp_server.context import text_tool

TOPIC = Field(description="Full topic name with its namespace, \"/namespace/topic-name\". "
                          "Example: \"/default/user-events\"")
SUBSCRIPTION = Field(description="Subscription name; list_subscriptions shows them. "
                                 "Example: \"my-consumer-group\"")
U32 = {"ge": 0, "le": 2 ** 32 - 1}
U64 = {"ge": 0, "le": 2 ** 64 - 1}


def register(mcp, ctx):
    call = ctx.call

    @text_tool(mcp)
    async def list_topics(
            namespace: Annotated[Optional[str], Field(description=(
                "Namespace to list; give namespace or broker, not both. Example: "
                "\"default\""))] = None,
            broker: Annotated[Optional[str], Field(description=(
                "Broker ID to list the topics of; give broker or namespace."))] = None) -> str:
        """List the topics of a namespace or of a broker: name, broker and delivery
        (Reliable/NonReliable)."""
        if broker is not None:
            label = f"broker '{broker}'"
            r = await call("TopicAdmin", "ListBrokerTopics", adm.BrokerRequest(broker_id=broker),
                           doing="listing topics")
        elif namespace is not None:
            label = f"namespace '{namespace}'"
            r = await call("TopicAdmin", "ListNamespaceTopics",
                           adm.NamespaceRequest(name=namespace), doing="listing topics")
        else:
            return "Error: provide either 'namespace' or 'broker' parameter."
        if not r.topics:
            return f"No topics found in {label}."
        out = f"Found {len(r.topics)} topic(s) in {label}:\n\n"
        for t in r.topics:
            out += (f"Topic: {t.name}\nBroker: {t.broker_id or 'unassigned'}\n"
                    f"Delivery: {t.delivery}\n\n")
        return out

    @text_tool(mcp)
    async def describe_topic(topic: Annotated[str, TOPIC]) -> str:
        """Describe a topic: broker, delivery, schema (subject, ID, version, type,
        compatibility) and subscriptions."""
        r = await call("TopicAdmin", "DescribeTopic", adm.DescribeTopicRequest(name=topic),
                       doing="describing topic")
        out = f"Topic: {r.name}\n\nBroker ID: {r.broker_id}\nDelivery: {r.delivery}\n"
        if r.HasField("schema_subject"):
            out += f"\nSchema Information:\n  Subject: {r.schema_subject}\n"
            for field, name in (("schema_id", "Schema ID"), ("schema_version", "Version"),
                                ("schema_type", "Type"), ("compatibility_mode", "Compatibility")):
                if r.HasField(field):
                    out += f"  {name}: {getattr(r, field)}\n"
        if r.subscriptions:
            out += f"\nSubscriptions ({len(r.subscriptions)}):\n" + "".join(
                f"  {i}. {s}\n" for i, s in enumerate(r.subscriptions, 1))
        else:
            out += "\nNo subscriptions found.\n"
        return out

    @text_tool(mcp)
    async def create_topic(
            name: Annotated[str, TOPIC],
            partitions: Annotated[int, Field(**U32, description=(
                "Partitions; 0 for a non-partitioned topic. Default: 0"))] = 0,
            dispatch_strategy: Annotated[str, Field(description=(
                "\"reliable\" (stored in the WAL and the durable tier) or \"non_reliable\" "
                "(in memory only). Default: \"non_reliable\""))] = "non_reliable",
            schema_subject: Annotated[Optional[str], Field(description=(
                "A registered schema subject to validate against (register_schema "
                "first)."))] = None) -> str:
        """Create a topic, partitioned or not, with an optional schema subject."""
        strategy = adm.Reliable if dispatch_strategy.lower() == "reliable" else adm.NonReliable
        if partitions > 0:
            req = adm.PartitionedTopicRequest(base_name=name, partitions=partitions,
                                              dispatch_strategy=strategy)
            if schema_subject is not None:
                req.schema_subject = schema_subject
            await call("TopicAdmin", "CreatePartitionedTopic", req,
                       doing="creating partitioned topic")
            return (f"Successfully created partitioned topic '{name}' with {partitions} "
                    f"partitions ({dispatch_strategy})")
        req = adm.NewTopicRequest(name=name, dispatch_strategy=strategy)
        if schema_subject is not None:
            req.schema_subject = schema_subject
        await call("TopicAdmin", "CreateTopic", req, doing="creating topic")
        return f"Successfully created topic '{name}' ({dispatch_strategy})"

    @text_tool(mcp)
    async def delete_topic(topic: Annotated[str, TOPIC]) -> str:
        """Delete a topic with its messages and subscriptions (irreversible)."""
        await call("TopicAdmin", "DeleteTopic", adm.TopicRequest(name=topic),
                   doing="deleting topic")
        return f"Successfully deleted topic '{topic}'"

    @text_tool(mcp)
    async def list_subscriptions(topic: Annotated[str, TOPIC]) -> str:
        """List the subscriptions of a topic."""
        r = await call("TopicAdmin", "ListSubscriptions", adm.TopicRequest(name=topic),
                       doing="listing subscriptions")
        if not r.subscriptions:
            return f"No subscriptions found on topic '{topic}'"
        return (f"Found {len(r.subscriptions)} subscription(s) on topic '{topic}':\n\n" +
                "".join(f"  {i}. {s}\n" for i, s in enumerate(r.subscriptions, 1)))

    @text_tool(mcp)
    async def unsubscribe(topic: Annotated[str, TOPIC],
                          subscription: Annotated[str, SUBSCRIPTION]) -> str:
        """Delete a subscription and its cursor from a topic."""
        r = await call("TopicAdmin", "Unsubscribe", adm.SubscriptionRequest(
            topic=topic, subscription=subscription), doing="deleting subscription")
        verb = "✓ Successfully deleted" if r.success else "✗ Failed to delete"
        return f"{verb} subscription '{subscription}' from topic '{topic}'"

    @text_tool(mcp)
    async def unload_topic(topic: Annotated[str, TOPIC]) -> str:
        """Unload a topic from its broker so it is assigned again (to another broker in a
        cluster)."""
        r = await call("TopicAdmin", "UnloadTopic", adm.TopicRequest(name=topic),
                       doing="unloading topic")
        return (f"✓ Successfully unloaded topic '{topic}' for reassignment" if r.success
                else f"✗ Failed to unload topic '{topic}'")

    @text_tool(mcp)
    async def configure_topic_schema(
            topic: Annotated[str, TOPIC],
            schema_subject: Annotated[str, Field(description="A registered schema subject.")],
            validation_policy: Annotated[str, Field(description=(
                "\"none\", \"warn\" or \"enforce\". Default: \"none\""))] = "none",
            enable_payload_validation: Annotated[bool, Field(description=(
                "Check each payload against the schema. Default: false"))] = False) -> str:
        """Attach a schema subject to a topic with a validation policy."""
        policy = validation_policy.upper()
        r = await call("SchemaRegistry", "ConfigureTopicSchema", sr.ConfigureTopicSchemaRequest(
            topic_name=topic, schema_subject=schema_subject, validation_policy=policy,
            enable_payload_validation=enable_payload_validation),
            doing="configuring topic schema")
        if not r.success:
            return f"✗ Failed to configure schema for topic '{topic}': {r.message}"
        return (f"✓ Schema configuration set for topic '{topic}'\n  Subject: {schema_subject}\n"
                f"  Policy: {policy}\n  Validation: "
                f"{'ENABLED' if enable_payload_validation else 'DISABLED'}")

    @text_tool(mcp)
    async def set_topic_validation_policy(
            topic: Annotated[str, TOPIC],
            policy: Annotated[str, Field(description="\"none\", \"warn\" or \"enforce\".")],
            enable_payload_validation: Annotated[bool, Field(description=(
                "Check each payload against the schema. Default: false"))] = False) -> str:
        """Change how strictly a topic's messages are checked against its schema."""
        r = await call("SchemaRegistry", "UpdateTopicValidationPolicy",
                       sr.UpdateTopicValidationPolicyRequest(
                           topic_name=topic, validation_policy=policy.upper(),
                           enable_payload_validation=enable_payload_validation),
                       doing="updating validation policy")
        if not r.success:
            return f"✗ Failed to update validation policy for topic '{topic}': {r.message}"
        return (f"✓ Validation policy updated for topic '{topic}'\n  Policy: {policy.upper()}\n"
                f"  Validation: {'ENABLED' if enable_payload_validation else 'DISABLED'}")

    @text_tool(mcp)
    async def get_topic_schema_config(topic: Annotated[str, TOPIC]) -> str:
        """Show a topic's schema subject, validation policy and payload validation."""
        r = await call("SchemaRegistry", "GetTopicSchemaConfig",
                       sr.GetTopicSchemaConfigRequest(topic_name=topic),
                       doing="getting schema config")
        if not r.schema_subject:
            return f"No schema configured for topic '{topic}'"
        out = (f"Schema Configuration for topic '{topic}':\n\n  Subject: {r.schema_subject}\n"
               f"  Policy: {r.validation_policy.upper()}\n  Payload Validation: "
               f"{'ENABLED' if r.enable_payload_validation else 'DISABLED'}\n")
        if r.schema_id > 0:
            out += f"  Cached Schema ID: {r.schema_id}\n"
        return out

    @text_tool(mcp)
    async def set_subscription_failure_policy(
            topic: Annotated[str, TOPIC], subscription: Annotated[str, SUBSCRIPTION],
            max_redelivery_count: Annotated[int, Field(**U32, description=(
                "Redeliveries before the poison policy applies. Example: 5"))],
            ack_timeout_ms: Annotated[int, Field(**U64, description=(
                "Redeliver a message not acked in this time. Example: 30000"))],
            base_redelivery_delay_ms: Annotated[int, Field(**U64, description=(
                "First delay before a redelivery. Example: 1000"))],
            max_redelivery_delay_ms: Annotated[int, Field(**U64, description=(
                "Longest delay before a redelivery. Example: 60000"))],
            poison_policy: Annotated[str, Field(description=(
                "After the last redelivery: \"dead_letter\", \"block\" or \"drop\"."))],
            backoff_strategy: Annotated[str, Field(description=(
                "\"fixed\" or \"exponential\". Default: \"fixed\""))] = "fixed",
            dead_letter_topic: Annotated[Optional[str], Field(description=(
                "Topic for poison messages with \"dead_letter\". Example: "
                "\"/default/user-events-dlq\""))] = None) -> str:
        """Set how a subscription handles failed deliveries: redeliveries, backoff and what
        becomes of a poison message."""
        policy = adm.SubscriptionFailurePolicy(
            max_redelivery_count=max_redelivery_count, ack_timeout_ms=ack_timeout_ms,
            base_redelivery_delay_ms=base_redelivery_delay_ms,
            max_redelivery_delay_ms=max_redelivery_delay_ms,
            backoff_strategy=adm.Exponential if backoff_strategy.lower() == "exponential"
            else adm.Fixed,
            poison_policy={"block": adm.Block, "drop": adm.Drop}.get(poison_policy.lower(),
                                                                    adm.DeadLetter))
        if dead_letter_topic is not None:
            policy.dead_letter_topic = dead_letter_topic
        r = await call("TopicAdmin", "SetSubscriptionFailurePolicy",
                       adm.SetSubscriptionFailurePolicyRequest(
                           topic=topic, subscription=subscription, failure_policy=policy),
                       doing="setting failure policy")
        verb = "✓ Failure policy updated" if r.success else "✗ Failed to update failure policy"
        return f"{verb} for topic '{topic}' subscription '{subscription}'"

    @text_tool(mcp)
    async def get_subscription_failure_policy(
            topic: Annotated[str, TOPIC], subscription: Annotated[str, SUBSCRIPTION]) -> str:
        """Show a subscription's failure policy."""
        r = await call("TopicAdmin", "GetSubscriptionFailurePolicy",
                       adm.GetSubscriptionFailurePolicyRequest(topic=topic,
                                                               subscription=subscription),
                       doing="getting failure policy")
        if not r.HasField("failure_policy"):
            return f"No failure policy found for topic '{topic}' subscription '{subscription}'"
        p = r.failure_policy
        out = (f"Failure Policy for topic '{topic}' subscription '{subscription}':\n\n"
               f"  Max Redelivery Count: {p.max_redelivery_count}\n"
               f"  Ack Timeout: {p.ack_timeout_ms} ms\n"
               f"  Base Redelivery Delay: {p.base_redelivery_delay_ms} ms\n"
               f"  Max Redelivery Delay: {p.max_redelivery_delay_ms} ms\n"
               f"  Backoff Strategy: "
               f"{'exponential' if p.backoff_strategy == adm.Exponential else 'fixed'}\n"
               f"  Poison Policy: "
               f"{ {adm.Block: 'block', adm.Drop: 'drop'}.get(p.poison_policy, 'dead_letter')}\n")
        if p.HasField("dead_letter_topic"):
            out += f"  Dead Letter Topic: {p.dead_letter_topic}\n"
        return out
