"""Fuzz target: every request message of every service the broker serves, as raw bytes, to a
real broker process on its client and its admin port.

The input is `port byte | method byte | message bytes`: the method is one of every method of
the DanubeApi, DanubeAdmin, DanubeExt and SchemaRegistry descriptors (a port that does not
serve it answers UNIMPLEMENTED), and the message goes out as it is, through our own client
with no serializer. Seeds are valid messages of each method, every field filled (the ids of a
producer and a consumer the target creates first, so calls reach past the lookups).

Findings: an INTERNAL or UNKNOWN status, a broker log line with a traceback or a failed
handler, the broker exiting, or the broker not answering a HealthCheck afterwards.
"""

import asyncio
import collections
import contextlib
import sys
import tempfile

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor as F

from danube.proto import DanubeAdmin_pb2, DanubeApi_pb2, DanubeExt_pb2, SchemaRegistry_pb2
from danube.rpc import RpcError, StatusCode
from danube.rpc.client import Channel
from broker_process import BrokerProcess
from fuzz_codecs import Finding, check

MODULES = (DanubeApi_pb2, DanubeAdmin_pb2, DanubeExt_pb2, SchemaRegistry_pb2)
CALL_TIMEOUT = 5.0            # a unary call
STREAM_SECONDS = 0.2          # how long a server-streaming call is read before it is cancelled
HEALTH_EVERY = 25             # executions between health checks
TOPIC = "/default/fuzz"
BAD_STATUS = (StatusCode.INTERNAL, StatusCode.UNKNOWN)
# String fields that take one of a few words: a seed with a valid one reaches further.
STRING_VALUES = {"compatibility_mode": "backward", "validation_policy": "warn",
                 "scope": "topic", "principal_type": "user", "permissions": "produce",
                 "resource": TOPIC}
BAD_LOG = ("Traceback", " failed: ", "internal error handling input")


def all_methods():
    """(path, method descriptor) of every method, in a fixed order."""
    out = []
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out.append((f"/{service.full_name}/{m.name}", m))
    return out


def _string_for(field):
    name = field.name
    if "topic" in name or (name in ("base_name", "name")
                           and "Topic" in field.containing_type.name):
        return TOPIC
    if "namespace" in name:
        return "default"
    if "subscription" in name:
        return "fuzz-sub"
    if name in STRING_VALUES:
        return STRING_VALUES[name]
    if "schema_type" in name:
        return "json_schema"
    if "schema_definition" in name:
        return '{"type": "object"}'
    return "fuzz"


def fill(message, ids, depth=0):
    """Every field of `message` set to a plausible value (ids: producer/consumer ids)."""
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None and message.WhichOneof(
                field.containing_oneof.name) is not None:
            continue
        value = _value(field, ids, depth)
        if value is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, field.name)[value[0]] = value[1]
        elif field.is_repeated and field.type == F.TYPE_MESSAGE:
            fill(getattr(message, field.name).add(), ids, depth + 1)
        elif field.is_repeated:
            getattr(message, field.name).append(value)
        elif field.type == F.TYPE_MESSAGE:
            fill(getattr(message, field.name), ids, depth + 1)
        else:
            setattr(message, field.name, value)
    return message


def _value(field, ids, depth):
    if field.type == F.TYPE_MESSAGE:
        if field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.type == F.TYPE_MESSAGE:
                return None
            return ("fuzz-key", _value(value_field, ids, depth))
        return True if depth < 3 else None
    if field.type == F.TYPE_STRING:
        return _string_for(field)
    if field.type == F.TYPE_BYTES:
        return b'{"fuzz": 1}'
    if field.type == F.TYPE_BOOL:
        return True
    if field.type == F.TYPE_ENUM:
        values = field.enum_type.values
        return values[1].number if len(values) > 1 else values[0].number
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return 1.5
    for key, value in ids.items():
        if key in field.name:
            return value
    return 1


# The broker dies with the process that started it (prctl PR_SET_PDEATHSIG): a libFuzzer run
# ends with exit(), with no chance to stop it.
_BROKER_MAIN = ("import ctypes, runpy, signal, sys; "
                "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
                "sys.argv[0] = 'danube'; runpy.run_module('danube', run_name='__main__')")


class BrokerTarget:
    def __init__(self, broker=None):
        self.own = broker is None
        if self.own:
            self.tmp = tempfile.TemporaryDirectory(prefix="danube-fuzz-broker-")
            broker = BrokerProcess(data_dir=self.tmp.name)
            broker.command = [sys.executable, "-P", "-c", _BROKER_MAIN, "broker"]
            broker.start()
        self.broker = broker
        self.loop = asyncio.new_event_loop()
        self.channels = [Channel(broker.client_addr), Channel(broker.admin_addr)]
        self.methods = all_methods()
        self.runs = 0
        self.codes = collections.Counter()     # status codes seen: what the inputs reached
        self.log_seen = len(broker.lines)
        self.ids = self.loop.run_until_complete(self._make_ids())
        self.served = self.loop.run_until_complete(self._served_ports())
        self.log_seen = len(broker.lines)

    def close(self):
        for channel in self.channels:
            self.loop.run_until_complete(channel.close())
        self.loop.close()
        if self.own:
            self.broker.stop()
            self.tmp.cleanup()

    async def _make_ids(self):
        api = DanubeApi_pb2
        call = self.channels[0].unary_unary
        producer = await call("/danube.ProducerService/CreateProducer",
                              lambda m: m.SerializeToString(), api.ProducerResponse.FromString)(
            api.ProducerRequest(request_id=1, producer_name="fuzz-p", topic_name=TOPIC),
            timeout=CALL_TIMEOUT)
        consumer = await call("/danube.ConsumerService/Subscribe",
                              lambda m: m.SerializeToString(), api.ConsumerResponse.FromString)(
            api.ConsumerRequest(request_id=2, topic_name=TOPIC, consumer_name="fuzz-c",
                                subscription="fuzz-sub"), timeout=CALL_TIMEOUT)
        return {"producer_id": producer.producer_id, "consumer_id": consumer.consumer_id}

    async def _served_ports(self):
        """For each method, the ports (0 client, 1 admin) that serve it: asked with an empty
        request, a port that does not answers UNIMPLEMENTED."""
        served = []
        for path, method in self.methods:
            ports = []
            for port, channel in enumerate(self.channels):
                code, details = await self._call(channel, path, method, b"")
                if not (code == StatusCode.UNIMPLEMENTED and "not found" in details):
                    ports.append(port)
            served.append(ports or [0, 1])
        return served

    def input_for(self, path, body, port=0):
        """The fuzz input that sends `body` to the method at `path` on `port`."""
        index = [p for p, _ in self.methods].index(path)
        return bytes((0xF0 | port, index)) + body

    def seeds(self):
        out = []
        for index, (path, method) in enumerate(self.methods):
            cls = message_factory.GetMessageClass(method.input_type)
            full = fill(cls(), self.ids).SerializeToString()
            out += [bytes((0, index)) + full, bytes((1, index)) + full, bytes((0xF1, index)),
                    bytes((0, index))]
        return out

    def __call__(self, data: bytes):
        if len(data) < 2:
            return
        self.runs += 1
        index = data[1] % len(self.methods)
        path, method = self.methods[index]
        # Byte 0 picks among the ports that serve the method; from 0xf0 up, its low bit
        # picks a port whatever it serves.
        served = self.served[index]
        port = data[0] & 1 if data[0] >= 0xF0 else served[data[0] % len(served)]
        channel = self.channels[port]
        code, details = self.loop.run_until_complete(self._call(channel, path, method, data[2:]))
        self.codes[code.name] += 1
        check(code not in BAD_STATUS, f"{path} answered {code.name}: {details}")
        self._check_log(path)
        if code == StatusCode.UNAVAILABLE or self.runs % HEALTH_EVERY == 0:
            self.check_alive()

    async def _call(self, channel, path, method, body):
        try:
            if method.server_streaming:
                call = await channel.unary_stream(path)(body, timeout=STREAM_SECONDS)
                try:
                    async for _ in call:
                        pass
                except RpcError as exc:
                    return exc.code, exc.details
                return call.code() or StatusCode.OK, ""
            await channel.unary_unary(path)(body, timeout=CALL_TIMEOUT)
            return StatusCode.OK, ""
        except RpcError as exc:
            return exc.code, exc.details

    def _check_log(self, path):
        lines = self.broker.lines[self.log_seen:]
        self.log_seen += len(lines)
        bad = [line.rstrip() for line in lines if any(b in line for b in BAD_LOG)]
        # The log arrives through a pipe: the line may be from this input or one just before.
        check(not bad, f"the broker logged (at {path} or just before): {bad[:5]}")

    def check_alive(self):
        check(self.broker.proc.poll() is None,
              f"the broker exited with {self.broker.proc.returncode}")
        api = DanubeApi_pb2
        health = self.channels[0].unary_unary("/danube.HealthCheck/HealthCheck",
                                              lambda m: m.SerializeToString(),
                                              api.HealthCheckResponse.FromString)
        try:
            self.loop.run_until_complete(health(api.HealthCheckRequest(
                client=api.HealthCheckRequest.Producer, id=self.ids["producer_id"]),
                timeout=CALL_TIMEOUT))
        except RpcError as exc:
            raise Finding(f"the broker does not answer HealthCheck: {exc}") from None


@contextlib.contextmanager
def broker_requests(broker=None):
    target = BrokerTarget(broker)
    try:
        yield target
    finally:
        target.close()
