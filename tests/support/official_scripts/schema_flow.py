"""Schema registry through the official client: register a JSON schema (twice: the second is
the same version), evolve it, read it back by subject, id and version, list versions, check
compatibility; then a reliable producer with the subject sends two messages, a producer with
an unregistered subject is refused, and a consumer sees schema_id and schema_version.

args: url, topic, subject, v1, v2 (schema texts), incompatible. Returns a dict of what it saw.
"""

import json

from _lib import Receiver, new_client
from danube import DispatchStrategy
from danube.schema import SchemaType


async def main(args):
    client = await new_client(args["url"])
    registry = client.schema()
    subject = args["subject"]
    first = await (registry.register_schema(subject).with_type(SchemaType.JSON_SCHEMA)
                   .with_schema_data(args["v1"].encode()).execute())
    same = await (registry.register_schema(subject).with_type(SchemaType.JSON_SCHEMA)
                  .with_schema_data(args["v1"].encode()).execute())
    second = await (registry.register_schema(subject).with_type(SchemaType.JSON_SCHEMA)
                    .with_schema_data(args["v2"].encode()).execute())
    latest = await registry.get_latest_schema(subject)
    by_version = await registry.get_schema_version(first, 1)
    versions = await registry.list_versions(subject)
    ok = await registry.check_compatibility(subject, args["v2"].encode(),
                                            SchemaType.JSON_SCHEMA)
    bad = await registry.check_compatibility(subject, args["incompatible"].encode(),
                                             SchemaType.JSON_SCHEMA)

    producer = (client.new_producer().with_topic(args["topic"]).with_name("schema-producer")
                .with_schema_subject(subject)
                .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
    await producer.create()
    receiver = await Receiver.start(client, args["topic"], "schema-consumer", "schema-sub",
                                    "exclusive")
    await producer.send(json.dumps({"id": 1, "item": "book"}).encode(), {})
    await producer.send(json.dumps({"id": 2}).encode(), {})
    await receiver.count(2, 10)
    refused = None
    try:
        other = (client.new_producer().with_topic(args["topic"] + "-other")
                 .with_name("nope").with_schema_subject("never-registered").build())
        await other.create()
    except Exception as exc:  # noqa: BLE001 - the scenario reports what it got
        refused = str(exc)
    return {
        "ids": [first, same, second],
        "latest": {"version": latest.version, "schema_id": latest.schema_id,
                   "schema_type": latest.schema_type,
                   "definition": latest.schema_definition_as_string()},
        "v1_version": by_version.version, "versions": list(versions),
        "compatible": [ok[0], bad[0]],
        "received": receiver.messages, "refused": refused,
    }
