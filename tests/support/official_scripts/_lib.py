"""Helpers for official-client scenarios (imported as `_lib` by scripts that the runner
executes under the official client's interpreter; see tests/support/official_client.py)."""

import asyncio
import base64
import time

import grpc
from danube import DanubeClientBuilder, DispatchStrategy, ProducerOptions, SubType
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc


async def new_client(url):
    return await DanubeClientBuilder().service_url(url).build()


def sub_type(name):
    return SubType[name.upper()]


async def new_producer(client, topic, name, partitions=None, reliable=False, retry=None):
    """``retry``: the producer's ProducerOptions as a dict (max_retries, base_backoff_ms,
    max_backoff_ms), else the client's defaults."""
    builder = client.new_producer().with_topic(topic).with_name(name)
    if retry:
        builder = builder.with_options(ProducerOptions(**retry))
    if partitions:
        builder = builder.with_partitions(partitions)
    if reliable:
        builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
    producer = builder.build()
    await producer.create()
    return producer


def producer_ids(producer):
    """The broker-assigned producer ids of a (possibly partitioned) official Producer."""
    return [tp.producer_id for tp in producer._producers]


def consumer_ids(consumer):
    """{partition topic: consumer id} of an official Consumer."""
    return {name: tc.consumer_id for name, tc in consumer._consumers.items()}


class Receiver:
    """An official consumer, subscribed and receiving: a background task takes its messages
    off the client's queue (acking each one unless ack=False) into `messages`."""

    def __init__(self, consumer, queue, ack=True):
        self.consumer = consumer
        self.queue = queue
        self.ack = ack
        self.messages = []
        self.ack_errors = []
        self._arrived = asyncio.Event()
        self._pump = asyncio.ensure_future(self._run())

    @classmethod
    async def start(cls, client, topic, name, subscription, kind="shared", key_filters=(),
                    ack=True):
        builder = (client.new_consumer().with_topic(topic).with_consumer_name(name)
                   .with_subscription(subscription).with_subscription_type(sub_type(kind)))
        for pattern in key_filters:
            builder = builder.with_key_filter(pattern)
        consumer = builder.build()
        await consumer.subscribe()
        queue = await consumer.receive()
        return cls(consumer, queue, ack)

    async def _run(self):
        while True:
            msg = await self.queue.get()
            if self.ack:
                try:
                    await self.consumer.ack(msg)
                except Exception as exc:  # noqa: BLE001 - reported to the test
                    self.ack_errors.append(repr(exc))
            self.messages.append(msg_dict(msg))
            self._arrived.set()

    async def until(self, predicate, timeout=10.0):
        """Wait until predicate(self.messages) holds or timeout; returns whether it held."""
        deadline = time.monotonic() + timeout
        while not predicate(self.messages):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                return predicate(self.messages)
        return True

    async def count(self, n, timeout=10.0):
        return await self.until(lambda msgs: len(msgs) >= n, timeout)

    async def quiet(self, period=0.3):
        """Wait until nothing more has arrived for `period` seconds."""
        while True:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), period)
            except asyncio.TimeoutError:
                return

    async def close(self):
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)
        await self.consumer.close()


async def wait_all(predicate, timeout=10.0, step=0.01):
    """Poll predicate() until it holds or timeout; returns whether it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


def msg_dict(m):
    out = {
        "payload": m.payload.decode("utf-8", "replace"),
        "payload_b64": base64.b64encode(m.payload).decode("ascii"),
        "attributes": dict(m.attributes),
        "topic": m.msg_id.topic_name,
        "producer_id": m.msg_id.producer_id,
        "topic_offset": m.msg_id.topic_offset,
        "request_id": m.request_id,
        "producer_name": m.producer_name,
        "routing_key": m.routing_key if m.HasField("routing_key") else None,
    }
    # Only when set, so scenarios without schemas see the dict they always saw.
    if m.HasField("schema_id"):
        out["schema_id"] = m.schema_id
    if m.HasField("schema_version"):
        out["schema_version"] = m.schema_version
    return out


async def health(url, client_type, client_id):
    """HealthCheck status name ("OK"/"CLOSE") of a producer ("producer") or consumer."""
    target = url.split("://", 1)[-1]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.HealthCheckStub(channel)
        kind = (pb.HealthCheckRequest.Producer if client_type == "producer"
                else pb.HealthCheckRequest.Consumer)
        resp = await stub.HealthCheck(pb.HealthCheckRequest(request_id=1, client=kind,
                                                            id=client_id), timeout=5)
        return pb.HealthCheckResponse.ClientStatus.Name(resp.status)


async def wait_health(url, client_type, client_id, status, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        got = await health(url, client_type, client_id)
        if got == status or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


def _varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


async def admin_delete_topic(admin_addr, topic):
    """danube_admin.TopicAdmin/DeleteTopic (the official client has no admin stubs: the
    TopicRequest{name = 1} is encoded by hand). Returns None or an error string."""
    return await admin_topic_call(admin_addr, "DeleteTopic", topic)


async def admin_topic_call(admin_addr, method, topic):
    """A danube_admin.TopicAdmin method taking a TopicRequest (DeleteTopic, UnloadTopic).
    Returns None or an error string."""
    data = topic.encode()
    request = b"\x0a" + _varint(len(data)) + data
    async with grpc.aio.insecure_channel(admin_addr) as channel:
        call = channel.unary_unary(f"/danube_admin.TopicAdmin/{method}")
        try:
            await call(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return None


def error_info(exc):
    if isinstance(exc, grpc.aio.AioRpcError):
        return {"type": "rpc", "code": exc.code().name, "details": exc.details()}
    return {"type": type(exc).__name__, "code": None, "details": str(exc)}


# -- reliable topics ---------------------------------------------------------------------

def action_of(plan, msg, attempt):
    """The action a PlannedReceiver takes on delivery number `attempt` (1-based) of a
    message: plan["by_payload"][payload] or plan["by_key"][routing key] is a list of actions
    for attempts 1, 2, ... (the last one repeats), else plan["default"] ("ack"). Actions:
    "ack", "hold" (neither ack nor nack), "nack", "nack@<delay_ms>", "nack:<reason>",
    "nack@<delay_ms>:<reason>", "close" (hold it and close the consumer)."""
    payload = msg.payload.decode("utf-8", "replace")
    key = msg.routing_key if msg.HasField("routing_key") else None
    actions = plan.get("by_payload", {}).get(payload)
    if actions is None and key is not None:
        actions = plan.get("by_key", {}).get(key)
    if not actions:
        return plan.get("default", "ack")
    return actions[min(attempt, len(actions)) - 1]


class PlannedReceiver:
    """An official consumer that acks, nacks or holds each delivery as a plan says (see
    action_of) and records every delivery as msg_dict + {"attempt", "action", "t"}.

    attempt counts deliveries of the same topic offset, over all receivers sharing `counts`.
    With plan["reverse_batch"] = k, acks are held back and sent k at a time in reverse
    order (the rest once nothing new arrived for 0.2 s): out-of-order acks."""

    def __init__(self, consumer, queue, plan=None, counts=None, t0=None):
        self.consumer = consumer
        self.queue = queue
        self.plan = plan or {}
        self.counts = {} if counts is None else counts
        self.t0 = time.monotonic() if t0 is None else t0
        self.deliveries = []
        self.errors = []
        self.pending_acks = []
        self.closed = False
        self._arrived = asyncio.Event()
        self._pump = asyncio.ensure_future(self._run())

    @classmethod
    async def start(cls, client, topic, name, subscription, kind="exclusive", plan=None,
                    counts=None, t0=None, key_filters=()):
        builder = (client.new_consumer().with_topic(topic).with_consumer_name(name)
                   .with_subscription(subscription).with_subscription_type(sub_type(kind)))
        for pattern in key_filters:
            builder = builder.with_key_filter(pattern)
        consumer = builder.build()
        await consumer.subscribe()
        queue = await consumer.receive()
        return cls(consumer, queue, plan, counts, t0)

    async def _run(self):
        batch = self.plan.get("reverse_batch")
        while True:
            if batch and self.pending_acks:
                try:
                    msg = await asyncio.wait_for(self.queue.get(), 0.2)
                except asyncio.TimeoutError:
                    await self._flush_acks()
                    continue
            else:
                msg = await self.queue.get()
            offset = msg.msg_id.topic_offset
            attempt = self.counts[offset] = self.counts.get(offset, 0) + 1
            action = action_of(self.plan, msg, attempt)
            record = msg_dict(msg)
            record.update(attempt=attempt, action=action, broker_addr=msg.msg_id.broker_addr,
                          t=round(time.monotonic() - self.t0, 4))
            self.deliveries.append(record)
            self._arrived.set()
            try:
                if action == "ack":
                    if batch:
                        self.pending_acks.append(msg)
                        if len(self.pending_acks) >= batch:
                            await self._flush_acks()
                    else:
                        await self.consumer.ack(msg)
                elif action.startswith("nack"):
                    head, _, reason = action.partition(":")
                    delay = head.partition("@")[2]
                    await self.consumer.nack(msg, int(delay) if delay else None,
                                             reason or None)
                elif action == "close":
                    await self.close()
                    return
            except Exception as exc:  # noqa: BLE001 - reported to the test
                self.errors.append(repr(exc))

    async def _flush_acks(self):
        held, self.pending_acks = self.pending_acks, []
        for msg in reversed(held):
            await self.consumer.ack(msg)

    def settled(self):
        """Payloads of deliveries that were acked (or are about to be, reverse_batch)."""
        return [d["payload"] for d in self.deliveries if d["action"] == "ack"]

    async def until(self, predicate, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(left, 0.1))
            except asyncio.TimeoutError:
                pass
        return True

    async def quiet(self, period=0.3):
        while True:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), period)
            except asyncio.TimeoutError:
                return

    async def close(self):
        """Close the consumer: its stream ends, so the broker takes back what it holds."""
        if self.closed:
            return
        self.closed = True
        if self._pump is not asyncio.current_task():
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        await self.consumer.close()
