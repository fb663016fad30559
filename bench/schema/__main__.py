"""bench.schema: the cost of schema validation on the publish path (issue 20), measured
against the same publish without it, in one broker and one run.

    python -m bench.schema [--quick] [--messages N] [--rounds R]

1. Publish: reliable batched publish (the project's client, send_many) of 200-byte messages
   stamped with their subject's schema_id, into two topics bound to the same subject: one with
   validation policy none, one with enforce + payload validation. JSON (JSON Schema) and Avro.
   Rounds interleave the two topics; the best round of each is kept.
2. Registry: a subject with 100 versions (each a compatible evolution of the one before);
   the time to check and to register one more, over the gRPC API (the registry checks a new
   version against every version it keeps).

Reported, not asserted: targets are enforce + payload validation >= 0.5x the unvalidated rate
for JSON and for Avro, and register / check against 100 versions under 50 ms."""

import argparse
import asyncio
import io
import json
import os
import shutil
import sys
import tempfile
import time

from bench.e2e.runner import Broker

JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": "string"},
        "country": {"type": "string", "enum": ["se", "no", "dk", "fi"]},
        "score": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}},
        "active": {"type": "boolean"},
    },
    "required": ["id", "name", "email"],
}
AVRO_SCHEMA = {
    "type": "record", "name": "Account", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "email", "type": "string"}, {"name": "country", "type": "string"},
        {"name": "score", "type": "double"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": "string"}, {"name": "active", "type": "boolean"},
    ],
}


def json_payloads(n):
    out = []
    for i in range(n):
        doc = {"id": i, "name": f"user-{i:08d}", "email": f"user{i:08d}@example.com",
               "country": "se", "score": i * 0.5, "tags": ["alpha", "beta", "gamma"],
               "active": True}
        raw = json.dumps(doc)
        doc["name"] += "x" * max(0, 200 - len(raw))      # 200 bytes each
        out.append(json.dumps(doc).encode())
    return out


def avro_payloads(n):
    import fastavro
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    out = []
    for i in range(n):
        record = {"id": i, "name": f"user-{i:08d}", "email": f"user{i:08d}@example.com",
                  "country": "se", "score": i * 0.5, "tags": ["alpha", "beta", "gamma"],
                  "note": "", "active": True}
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        record["note"] = "n" * max(0, 200 - len(buf.getvalue()) - 1)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


async def registry_call(client, method, request):
    stub = client.pool.stub(client.service_url)
    return await getattr(stub, method)(request, timeout=60)


async def publish_round(client, topic, subject, payloads):
    from danube.client import schema_reference
    producer = await client.create_producer(topic, f"bench-{time.monotonic_ns()}",
                                            reliable=True, schema=schema_reference(subject))
    t0 = time.perf_counter()
    await producer.send_many(payloads)
    elapsed = time.perf_counter() - t0
    await producer.close()
    return len(payloads) / elapsed


async def run_publish(url, kind, schema, payloads, rounds):
    from danube.client import DanubeClient
    from danube.proto import SchemaRegistry_pb2 as sr
    subject = f"bench-{kind}"
    async with DanubeClient(url) as client:
        await registry_call(client, "register_schema", sr.RegisterSchemaRequest(
            subject=subject, schema_type=kind, schema_definition=json.dumps(schema).encode()))
        topics = {"none": f"/default/schema-bench-{kind}-none",
                  "enforce+payload": f"/default/schema-bench-{kind}-enforce"}
        # A first producer binds each topic; then the policy is set.
        for policy, topic in topics.items():
            await publish_round(client, topic, subject, payloads[:100])
        stub = client.pool.stub(client.service_url)
        await stub.configure_topic_schema(sr.ConfigureTopicSchemaRequest(
            topic_name=topics["enforce+payload"], schema_subject=subject,
            validation_policy="enforce", enable_payload_validation=True), timeout=10)
        rates = {policy: [] for policy in topics}
        for _ in range(rounds):
            for policy, topic in topics.items():
                rates[policy].append(await publish_round(client, topic, subject, payloads))
        return {policy: max(r) for policy, r in rates.items()}


def evolution(i):
    """Version i of a JSON Schema subject: i optional properties, each a compatible step."""
    return {"type": "object", "properties": {f"f{k}": {"type": "string"} for k in range(i)}}


async def run_registry(url, versions):
    from danube.client import DanubeClient
    from danube.proto import SchemaRegistry_pb2 as sr
    subject = "bench-versions"
    async with DanubeClient(url) as client:
        for i in range(1, versions + 1):
            await registry_call(client, "register_schema", sr.RegisterSchemaRequest(
                subject=subject, schema_type="json_schema",
                schema_definition=json.dumps(evolution(i)).encode()))
        new = json.dumps(evolution(versions + 1)).encode()
        t0 = time.perf_counter()
        check = await registry_call(client, "check_compatibility", sr.CheckCompatibilityRequest(
            subject=subject, schema_type="json_schema", new_schema_definition=new))
        check_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        reg = await registry_call(client, "register_schema", sr.RegisterSchemaRequest(
            subject=subject, schema_type="json_schema", schema_definition=new))
        register_ms = (time.perf_counter() - t0) * 1000
        assert check.is_compatible and reg.version == versions + 1, (check, reg)
        return check_ms, register_ms


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.schema", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20,000 messages, 2 rounds")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--rounds", type=int)
    args = ap.parse_args(argv)
    n = args.messages or (20_000 if args.quick else 200_000)
    rounds = args.rounds or (2 if args.quick else 3)

    scratch = tempfile.mkdtemp(prefix="danube-schema-bench-")
    broker = Broker(os.path.join(scratch, "data"), os.path.join(scratch, "broker.log"))
    results = {}
    try:
        for kind, schema, make in (("json_schema", JSON_SCHEMA, json_payloads),
                                   ("avro", AVRO_SCHEMA, avro_payloads)):
            payloads = make(n)
            size = sum(map(len, payloads)) / len(payloads)
            print(f"[publish] {kind}: {n:,} messages of {size:.0f} B, {rounds} rounds ...",
                  flush=True)
            results[kind] = (size, asyncio.run(run_publish(broker.url, kind, schema, payloads,
                                                           rounds)))
        print("[registry] 100 versions, then check and register one more ...", flush=True)
        check_ms, register_ms = asyncio.run(run_registry(broker.url, 100))
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    print()
    print(f"{'format':<12} {'size':>5} {'no validation':>15} {'enforce+payload':>16} {'ratio':>6}")
    ok = True
    for kind, (size, rates) in results.items():
        ratio = rates["enforce+payload"] / rates["none"]
        ok &= ratio >= 0.5
        print(f"{kind:<12} {size:>4.0f}B {rates['none']:>11,.0f}/s {rates['enforce+payload']:>12,.0f}"
              f"/s {ratio:>5.2f}x")
    print(f"\nregistry, subject with 100 versions: check {check_ms:.1f} ms, register "
          f"{register_ms:.1f} ms")
    print("targets:")
    for kind, (_, rates) in results.items():
        ratio = rates["enforce+payload"] / rates["none"]
        print(f"  [{'met' if ratio >= 0.5 else 'NOT met'}] {kind}: enforce + payload "
              f"validation >= 0.5x unvalidated ({ratio:.2f}x)")
    slow = max(check_ms, register_ms)
    print(f"  [{'met' if slow < 50 else 'NOT met'}] register and check against 100 versions "
          f"< 50 ms ({check_ms:.1f} / {register_ms:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
