"""danube_schema.SchemaRegistry against the real broker process (issue 20): every call of
reference a.2 through a plain grpcio client on both ports, upstream's wire forms (the
serde-JSON schema_definition, lowercase modes, one schema_id per subject), the codes, restart,
concurrent registration, and topic binding with validation (none / warn / enforce) on the
single-message and the batched publish paths."""

import asyncio
import json
import time

import grpc
import pytest

from broker_process import BrokerProcess
from danube.client import DanubeClient, schema_reference
from danube.client import errors as client_errors
from danube.proto import SchemaRegistry_pb2 as sr
from waiting import async_wait_for

SERVICE = "/danube_schema.SchemaRegistry/"

ORDER_V1 = {"type": "object", "properties": {"id": {"type": "integer"},
                                              "item": {"type": "string"}},
            "required": ["id"]}
ORDER_V2 = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "note": {"type": "string"}}}
ORDER_BAD = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "qty": {"type": "integer"}},
             "required": ["id", "qty"]}
AVRO_V1 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}
AVRO_V2 = {**AVRO_V1, "fields": AVRO_V1["fields"] + [{"name": "age", "type": "int",
                                                       "default": 0}]}
AVRO_BAD = {**AVRO_V1, "fields": AVRO_V1["fields"] + [{"name": "age", "type": "int"}]}

_RESPONSES = {
    "RegisterSchema": sr.RegisterSchemaResponse, "GetSchema": sr.GetSchemaResponse,
    "GetLatestSchema": sr.GetSchemaResponse, "ListVersions": sr.ListVersionsResponse,
    "CheckCompatibility": sr.CheckCompatibilityResponse,
    "DeleteSchemaVersion": sr.DeleteSchemaVersionResponse,
    "SetCompatibilityMode": sr.SetCompatibilityModeResponse,
    "ConfigureTopicSchema": sr.ConfigureTopicSchemaResponse,
    "UpdateTopicValidationPolicy": sr.UpdateTopicValidationPolicyResponse,
    "GetTopicSchemaConfig": sr.GetTopicSchemaConfigResponse,
    "ListSubjects": sr.ListSubjectsResponse,
}


class Registry:
    def __init__(self, addr):
        self.channel = grpc.aio.insecure_channel(addr)

    def __getattr__(self, method):
        call = self.channel.unary_unary(SERVICE + method,
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=_RESPONSES[method].FromString)
        return lambda request: call(request, timeout=10)

    async def close(self):
        await self.channel.close()


async def status_of(coro):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    return info.value.code(), info.value.details()


def js(obj):
    return json.dumps(obj).encode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess("--prom-exporter", "127.0.0.1:0",
                         data_dir=tmp_path_factory.mktemp("schema") / "data").start()
    yield proc
    proc.stop()


def metric(broker, name, **labels):
    import re
    import urllib.request
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                  timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(re.split(r"\s+", line)[-1])
    return None


@pytest.fixture
async def reg(broker):
    r = Registry(broker.client_addr)
    yield r
    await r.close()


_n = 0


def subject(prefix="s"):
    global _n
    _n += 1
    return f"{prefix}-{_n}-{time.monotonic_ns()}"


async def test_register_get_and_list(reg, broker):
    name = subject("orders")
    first = await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="JSON_SCHEMA", schema_definition=js(ORDER_V1),
        description="v1", created_by="tests", tags=["a", "b"]))
    assert first.version == 1 and first.is_new_version and first.schema_id > 0
    assert first.fingerprint.startswith("sha256:")
    again = await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json", schema_definition=js(ORDER_V1)))
    assert (again.schema_id, again.version, again.is_new_version, again.fingerprint) == \
        (first.schema_id, 1, False, first.fingerprint)
    second = await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=js(ORDER_V2)))
    # schema_id names the subject: every version has the same one.
    assert (second.schema_id, second.version, second.is_new_version) == \
        (first.schema_id, 2, True)

    latest = await reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject=name))
    assert (latest.schema_id, latest.version, latest.subject, latest.schema_type) == \
        (first.schema_id, 2, name, "json_schema")
    assert latest.compatibility_mode == "backward"
    # Upstream's serde-JSON SchemaDefinition, not the raw text.
    definition = json.loads(latest.schema_definition)
    assert json.loads(definition["JsonSchema"]["raw_schema"]) == ORDER_V2
    assert definition["JsonSchema"]["fingerprint"] == second.fingerprint

    v1 = await reg.GetSchema(sr.GetSchemaRequest(schema_id=first.schema_id, version=1))
    assert (v1.version, v1.description, v1.created_by, list(v1.tags)) == \
        (1, "v1", "tests", ["a", "b"])
    assert v1.created_at > 1_600_000_000
    assert (await reg.GetSchema(sr.GetSchemaRequest(schema_id=first.schema_id))).version == 2

    versions = (await reg.ListVersions(sr.ListVersionsRequest(subject=name))).versions
    assert [(v.version, v.schema_id) for v in versions] == [(1, first.schema_id),
                                                           (2, first.schema_id)]
    subjects = {s.subject: s for s in
                (await reg.ListSubjects(sr.ListSubjectsRequest())).subjects}
    assert (subjects[name].latest_version, subjects[name].schema_type,
            subjects[name].schema_id, subjects[name].compatibility_mode) == \
        (2, "json_schema", first.schema_id, "backward")


async def test_simple_types_and_aliases(reg):
    for given, normal, wrapped in [("STRING", "string", "String"), ("bytes", "bytes", "Bytes"),
                                   ("int64", "number", "Number"), ("Double", "number", "Number")]:
        name = subject("simple")
        resp = await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject=name, schema_type=given, schema_definition=b""))
        assert resp.fingerprint == normal
        got = await reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject=name))
        assert got.schema_type == normal and json.loads(got.schema_definition) == wrapped


async def test_ids_are_per_subject_and_increase(reg):
    ids = []
    for _ in range(3):
        resp = await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject=subject("ids"), schema_type="string", schema_definition=b""))
        ids.append(resp.schema_id)
    assert ids == sorted(ids) and len(set(ids)) == 3


async def test_compatibility_checks_and_modes(reg):
    name = subject("avro")
    await reg.RegisterSchema(sr.RegisterSchemaRequest(subject=name, schema_type="avro",
                                                      schema_definition=js(AVRO_V1)))
    ok = await reg.CheckCompatibility(sr.CheckCompatibilityRequest(
        subject=name, schema_type="avro", new_schema_definition=js(AVRO_V2)))
    assert ok.is_compatible and not ok.errors
    bad = await reg.CheckCompatibility(sr.CheckCompatibilityRequest(
        subject=name, schema_type="avro", new_schema_definition=js(AVRO_BAD)))
    assert not bad.is_compatible and any("age" in e for e in bad.errors)
    # The per-call override: NONE accepts it.
    assert (await reg.CheckCompatibility(sr.CheckCompatibilityRequest(
        subject=name, schema_type="avro", new_schema_definition=js(AVRO_BAD),
        compatibility_mode="NONE"))).is_compatible
    code, details = await status_of(reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="avro", schema_definition=js(AVRO_BAD))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "age" in details
    assert "not compatible" in details

    resp = await reg.SetCompatibilityMode(sr.SetCompatibilityModeRequest(
        subject=name, compatibility_mode="None"))
    assert resp.success
    assert (await reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject=name))
            ).compatibility_mode == "none"
    forced = await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="avro", schema_definition=js(AVRO_BAD)))
    assert forced.version == 2 and forced.is_new_version

    code, details = await status_of(reg.SetCompatibilityMode(sr.SetCompatibilityModeRequest(
        subject=name, compatibility_mode="sideways")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "sideways" in details
    # Another type in the same subject is incompatible (unless the mode is none).
    await reg.SetCompatibilityMode(sr.SetCompatibilityModeRequest(
        subject=name, compatibility_mode="full"))
    code, _ = await status_of(reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=js(ORDER_V1))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_errors_name_the_problem(reg):
    cases = [
        (sr.RegisterSchemaRequest(subject=subject(), schema_type="yaml",
                                  schema_definition=b"{}"),
         grpc.StatusCode.INVALID_ARGUMENT, "yaml"),
        (sr.RegisterSchemaRequest(subject=subject(), schema_type="avro",
                                  schema_definition=b'{"type": "record"'),
         grpc.StatusCode.INVALID_ARGUMENT, "avro"),
        (sr.RegisterSchemaRequest(subject=subject(), schema_type="avro",
                                  schema_definition=js({"type": "record", "name": "X"})),
         grpc.StatusCode.INVALID_ARGUMENT, "avro"),
        (sr.RegisterSchemaRequest(subject=subject(), schema_type="json_schema",
                                  schema_definition=js({"type": "no-such-type"})),
         grpc.StatusCode.INVALID_ARGUMENT, "json"),
        (sr.RegisterSchemaRequest(subject=subject(), schema_type="protobuf",
                                  schema_definition=b"message M { int32 a = ; }"),
         grpc.StatusCode.INVALID_ARGUMENT, "proto"),
        (sr.RegisterSchemaRequest(subject="", schema_type="string"),
         grpc.StatusCode.INVALID_ARGUMENT, "subject"),
        (sr.RegisterSchemaRequest(subject="a/b", schema_type="string"),
         grpc.StatusCode.INVALID_ARGUMENT, "'/'"),
    ]
    for request, code, fragment in cases:
        got, details = await status_of(reg.RegisterSchema(request))
        assert got == code, (request, details)
        assert fragment.lower() in details.lower(), details
    for call in [reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject="nope-nothing")),
                 reg.GetSchema(sr.GetSchemaRequest(schema_id=987_654_321)),
                 reg.ListVersions(sr.ListVersionsRequest(subject="nope-nothing")),
                 reg.DeleteSchemaVersion(sr.DeleteSchemaVersionRequest(subject="nope-nothing",
                                                                       version=1)),
                 reg.GetTopicSchemaConfig(sr.GetTopicSchemaConfigRequest(
                     topic_name="/default/never-made"))]:
        code, _ = await status_of(call)
        assert code == grpc.StatusCode.NOT_FOUND


async def test_delete_versions(reg):
    name = subject("del")
    one = await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=js(ORDER_V1)))
    await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=js(ORDER_V2)))
    resp = await reg.DeleteSchemaVersion(sr.DeleteSchemaVersionRequest(subject=name, version=2))
    assert resp.success and "2" in resp.message
    assert (await reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject=name))).version == 1
    code, details = await status_of(reg.GetSchema(sr.GetSchemaRequest(
        schema_id=one.schema_id, version=2)))
    assert code == grpc.StatusCode.NOT_FOUND and "version 2" in details
    # Version numbers are not reused.
    again = await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=js(ORDER_V2)))
    assert again.version == 3
    for v in (1, 3):
        await reg.DeleteSchemaVersion(sr.DeleteSchemaVersionRequest(subject=name, version=v))
    code, _ = await status_of(reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject=name)))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_concurrent_registration_is_one_version(reg):
    name = subject("race")
    request = sr.RegisterSchemaRequest(subject=name, schema_type="json_schema",
                                       schema_definition=js(ORDER_V1))
    results = await asyncio.gather(*(reg.RegisterSchema(request) for _ in range(20)))
    assert {(r.schema_id, r.version) for r in results} == {(results[0].schema_id, 1)}
    assert sum(r.is_new_version for r in results) == 1
    assert len((await reg.ListVersions(sr.ListVersionsRequest(subject=name))).versions) == 1


async def test_both_ports_serve_it(broker):
    name = subject("ports")
    client_side, admin_side = Registry(broker.client_addr), \
        Registry(f"127.0.0.1:{broker.admin_port}")
    try:
        resp = await admin_side.RegisterSchema(sr.RegisterSchemaRequest(
            subject=name, schema_type="string"))
        got = await client_side.GetLatestSchema(sr.GetLatestSchemaRequest(subject=name))
        assert got.schema_id == resp.schema_id
    finally:
        await client_side.close()
        await admin_side.close()


async def test_restart_keeps_subjects_versions_and_ids(tmp_path):
    proc = BrokerProcess(data_dir=tmp_path / "data").start()
    try:
        reg = Registry(proc.client_addr)
        a = await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject="keep-a", schema_type="json_schema", schema_definition=js(ORDER_V1)))
        await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject="keep-a", schema_type="json_schema", schema_definition=js(ORDER_V2)))
        await reg.SetCompatibilityMode(sr.SetCompatibilityModeRequest(
            subject="keep-a", compatibility_mode="full"))
        async with DanubeClient(f"http://{proc.client_addr}") as client:
            producer = await client.create_producer("/default/keep", "p",
                                                    schema=schema_reference("keep-a"))
            await producer.send(js({"id": 1}))
        await reg.ConfigureTopicSchema(sr.ConfigureTopicSchemaRequest(
            topic_name="/default/keep", schema_subject="keep-a", validation_policy="enforce",
            enable_payload_validation=True))
        await reg.close()
    finally:
        proc.stop()
    proc = BrokerProcess(data_dir=tmp_path / "data").start()
    try:
        reg = Registry(proc.client_addr)
        latest = await reg.GetLatestSchema(sr.GetLatestSchemaRequest(subject="keep-a"))
        assert (latest.schema_id, latest.version, latest.compatibility_mode) == \
            (a.schema_id, 2, "full")
        b = await reg.RegisterSchema(sr.RegisterSchemaRequest(subject="keep-b",
                                                              schema_type="string"))
        assert b.schema_id > a.schema_id
        cfg = await reg.GetTopicSchemaConfig(sr.GetTopicSchemaConfigRequest(
            topic_name="/default/keep"))
        assert (cfg.schema_subject, cfg.validation_policy, cfg.enable_payload_validation,
                cfg.schema_id) == ("keep-a", "enforce", True, a.schema_id)
        await reg.close()
    finally:
        proc.stop()


# -- topic binding and validation ---------------------------------------------------------

async def test_first_producer_binds_the_topic(reg, broker):
    url = f"http://{broker.client_addr}"
    name, other = subject("bind"), subject("other")
    for s in (name, other):
        await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject=s, schema_type="json_schema", schema_definition=js(ORDER_V1)))
    topic = f"/default/{subject('bound')}"
    async with DanubeClient(url) as client:
        with pytest.raises(client_errors.DanubeError) as info:
            await client.create_producer(topic, "p0", schema=schema_reference("not-registered"))
        assert "not registered" in str(info.value)
        producer = await client.create_producer(topic, "p1", schema=schema_reference(name))
        await producer.send(js({"id": 1}))
        with pytest.raises(client_errors.DanubeError) as info:
            await client.create_producer(topic, "p2", schema=schema_reference(other))
        assert name in str(info.value)
        # A producer without a schema may still connect (upstream's topic_schema_config).
        plain = await client.create_producer(topic, "p3")
        await plain.send(b"anything")
    cfg = await reg.GetTopicSchemaConfig(sr.GetTopicSchemaConfigRequest(topic_name=topic))
    assert (cfg.schema_subject, cfg.validation_policy) == (name, "none")


async def _bound_topic(reg, client, policy, payloads, schema=ORDER_V1, kind="json_schema"):
    name = subject("val")
    await reg.RegisterSchema(sr.RegisterSchemaRequest(subject=name, schema_type=kind,
                                                      schema_definition=js(schema)))
    topic = f"/default/{subject('validated')}"
    good = await client.create_producer(topic, "good", reliable=True,
                                        schema=schema_reference(name))
    plain = await client.create_producer(topic, "plain", reliable=True)
    await reg.ConfigureTopicSchema(sr.ConfigureTopicSchemaRequest(
        topic_name=topic, schema_subject=name, validation_policy=policy,
        enable_payload_validation=payloads))
    return name, topic, good, plain


async def test_enforce_with_payload_validation(reg, broker):
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        name, topic, good, plain = await _bound_topic(reg, client, "ENFORCE", True)
        await good.send(js({"id": 7, "item": "book"}))
        with pytest.raises(client_errors.DanubeError) as info:
            await good.send(js({"id": "seven"}))
        assert "PERMISSION_DENIED" in repr(info.value) or "permission" in str(info.value).lower()
        assert "payload does not match" in str(info.value) and "id" in str(info.value)
        with pytest.raises(client_errors.DanubeError) as info:
            await good.send(b"not json")
        assert "payload" in str(info.value)
        with pytest.raises(client_errors.DanubeError) as info:
            await plain.send(js({"id": 1}))
        assert "no schema_id" in str(info.value)
        # The batched path: one bad payload refuses the whole batch, naming it.
        await good.producers[0].send_batch([js({"id": i}) for i in range(50)])
        with pytest.raises(Exception) as info:
            await good.producers[0].send_batch([js({"id": 1}), js({"id": 2}), js({"item": "x"})])
        assert "message 2 of the batch" in str(info.value)
        with pytest.raises(Exception) as info:
            await plain.producers[0].send_batch([js({"id": 1})])
        assert "message 0 of the batch has no schema_id" in str(info.value)
    cfg = await reg.GetTopicSchemaConfig(sr.GetTopicSchemaConfigRequest(topic_name=topic))
    assert (cfg.validation_policy, cfg.enable_payload_validation) == ("enforce", True)


async def test_enforce_avro_payloads(reg, broker):
    import io

    import fastavro
    parsed = fastavro.parse_schema(AVRO_V1)

    def avro(record):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record)
        return out.getvalue()

    async with DanubeClient(f"http://{broker.client_addr}") as client:
        _, _, good, _ = await _bound_topic(reg, client, "enforce", True, AVRO_V1, "avro")
        await good.send(avro({"name": "ada"}))
        await good.producers[0].send_batch([avro({"name": f"u{i}"}) for i in range(20)])
        with pytest.raises(client_errors.DanubeError) as info:
            await good.send(b"\x07")
        assert "payload does not match" in str(info.value)


async def test_warn_accepts_and_none_ignores(reg, broker):
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        _, topic, good, plain = await _bound_topic(reg, client, "warn", True)
        await good.send(js({"id": "wrong"}))
        await plain.send(b"no schema at all")
        # The broker's log is read by a thread of the test: the line may come after the ack.
        await async_wait_for(
            lambda: any("schema validation (warn)" in line and topic in line
                        for line in list(broker.lines)), what="the warn policy's log line")
        assert metric(broker, "danube_schema_validation_failures_total", topic=topic,
                      reason="payload_invalid") == 1
        assert metric(broker, "danube_schema_validation_failures_total", topic=topic,
                      reason="missing_schema_id") == 1
        assert metric(broker, "danube_schema_validation_total", topic=topic, policy="warn") == 2
        await reg.UpdateTopicValidationPolicy(sr.UpdateTopicValidationPolicyRequest(
            topic_name=topic, validation_policy="none"))
        await plain.send(b"fine")
        code, details = await status_of(reg.UpdateTopicValidationPolicy(
            sr.UpdateTopicValidationPolicyRequest(topic_name=topic,
                                                  validation_policy="strict")))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "strict" in details


async def test_unknown_version_is_refused_in_enforce(reg, broker):
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        name, topic, good, _ = await _bound_topic(reg, client, "enforce", False)
        good.producers[0].schema_version = 99
        with pytest.raises(client_errors.DanubeError) as info:
            await good.send(js({"id": 1}))
        assert "schema_version 99" in str(info.value)


async def test_another_subjects_schema_id_is_refused_in_enforce(reg, broker):
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        name, topic, good, _ = await _bound_topic(reg, client, "enforce", False)
        other = await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject=subject("other"), schema_type="json_schema", schema_definition=js(ORDER_V1)))
        own = good.producers[0].schema_id
        assert other.schema_id != own
        good.producers[0].schema_id = other.schema_id
        with pytest.raises(client_errors.DanubeError) as info:
            await good.send(js({"id": 1}))
        assert f"schema_id {other.schema_id} is not that of subject {name!r}" in str(info.value)
        good.producers[0].schema_id = own
        await good.send(js({"id": 1}))


# -- the official client ------------------------------------------------------------------

def test_official_client_registers_fetches_and_produces(broker):
    from official_client import broker_url, run_scenario, unique_topic
    subject_name = subject("official")
    topic = unique_topic("schema-official")
    result = run_scenario("schema_flow.py", {
        "url": broker_url(broker), "topic": topic, "subject": subject_name,
        "v1": json.dumps(ORDER_V1), "v2": json.dumps(ORDER_V2),
        "incompatible": json.dumps(ORDER_BAD)})
    first, same, second = result["ids"]
    assert first == same == second          # schema_id names the subject
    assert result["latest"]["version"] == 2 and result["latest"]["schema_id"] == first
    assert result["latest"]["schema_type"] == "json_schema"
    # Upstream's wire form: the serde-JSON SchemaDefinition wrapping the raw text.
    wrapped = json.loads(result["latest"]["definition"])
    assert json.loads(wrapped["JsonSchema"]["raw_schema"]) == ORDER_V2
    assert result["v1_version"] == 1 and result["versions"] == [1, 2]
    assert result["compatible"] == [True, False]
    received = result["received"]
    assert [json.loads(m["payload"])["id"] for m in received] == [1, 2]
    assert {(m["schema_id"], m["schema_version"]) for m in received} == {(first, 2)}
    assert result["refused"] and "never-registered" in result["refused"]


async def test_admin_create_topic_binds_its_schema_subject(reg, broker):
    from danube.proto import DanubeAdmin_pb2 as adm
    name = subject("admin")
    await reg.RegisterSchema(sr.RegisterSchemaRequest(subject=name, schema_type="string"))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}")
    try:
        def call(method, request):
            return channel.unary_unary(
                f"/danube_admin.TopicAdmin/{method}",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=adm.TopicResponse.FromString)(request, timeout=10)
        plain = f"/default/{subject('admin-plain')}"
        assert (await call("CreateTopic", adm.NewTopicRequest(
            name=plain, schema_subject=name))).success
        parted = f"/default/{subject('admin-parts')}"
        assert (await call("CreatePartitionedTopic", adm.PartitionedTopicRequest(
            base_name=parted, partitions=2, schema_subject=name))).success
        for topic in (plain, f"{parted}-part-0", f"{parted}-part-1"):
            cfg = await reg.GetTopicSchemaConfig(sr.GetTopicSchemaConfigRequest(
                topic_name=topic))
            assert cfg.schema_subject == name, topic
        missing = f"/default/{subject('admin-missing')}"
        code, details = await status_of(call("CreateTopic", adm.NewTopicRequest(
            name=missing, schema_subject="no-such-subject")))
        assert code == grpc.StatusCode.NOT_FOUND and "no-such-subject" in details
        code, _ = await status_of(reg.GetTopicSchemaConfig(sr.GetTopicSchemaConfigRequest(
            topic_name=missing)))
        assert code == grpc.StatusCode.NOT_FOUND         # nothing was created
    finally:
        await channel.close()


async def test_a_subject_stops_growing_before_one_metadata_record_cannot_hold_it(reg):
    """A subject's versions share one metadata record, and etcd refuses one over 1.5 MiB:
    the version that would pass 1 MiB is refused with a clear error, the others stay."""
    name = subject("big")
    filler = "x" * (300 * 1024)

    def version(i):
        # compatibility NONE below, so each version may differ freely
        return js({"type": "object", "description": f"{i}-{filler}"})
    await reg.RegisterSchema(sr.RegisterSchemaRequest(subject=name, schema_type="json_schema",
                                                      schema_definition=version(0)))
    await reg.SetCompatibilityMode(sr.SetCompatibilityModeRequest(subject=name,
                                                                  compatibility_mode="NONE"))
    for i in range(1, 3):
        await reg.RegisterSchema(sr.RegisterSchemaRequest(
            subject=name, schema_type="json_schema", schema_definition=version(i)))
    code, details = await status_of(reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=version(3))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert name in details and "DeleteSchemaVersion" in details
    listed = await reg.ListVersions(sr.ListVersionsRequest(subject=name))
    assert [v.version for v in listed.versions] == [1, 2, 3]
    # deleting one makes room again
    await reg.DeleteSchemaVersion(sr.DeleteSchemaVersionRequest(subject=name, version=1))
    await reg.RegisterSchema(sr.RegisterSchemaRequest(
        subject=name, schema_type="json_schema", schema_definition=version(3)))
