"""Producers. A TopicProducer is one broker-side producer on one topic (or partition); a
Producer spreads messages over one TopicProducer per partition (round-robin, or by key)."""

import asyncio
import itertools
import time

from danube.codec.msgbatch import encode_message_batch
from danube.client import errors
from danube.client.connection import BrokerAddress
from danube.client.schema import resolve_schema
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError, StatusCode

DEFAULT_WINDOW = 256
DEFAULT_BATCH = 1000
#: A payload at least this large is spliced into its serialized StreamMessage by hand.
LARGE_PAYLOAD = 65536


def _payload_tag(n):
    """StreamMessage.payload's key (field 3, length-delimited) and the varint length `n`."""
    out = bytearray(b"\x1a")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def fnv1a64(key: str) -> int:
    """64-bit FNV-1a, the key hash every official client uses to pick a partition."""
    h = 0xCBF29CE484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class TopicProducer:
    def __init__(self, client, topic, name, dispatch, schema_ref=None):
        self.client = client
        self.topic = topic
        self.name = name
        self.dispatch = dispatch
        self.schema_ref = schema_ref
        self.address = BrokerAddress(client.service_url, client.service_url)
        self.producer_id = None
        self.schema_id = self.schema_version = None
        # Upstream numbering: CreateProducer calls count from 0, messages from 1.
        self._create_ids = itertools.count(0)
        self._next_send_id = 1
        self._stub = None
        self._msg_id = None
        self._health = None
        self._generation = 0        # bumped by each successful create
        self._lock = asyncio.Lock()
        self.closed_by_broker = False

    async def create(self):
        client = self.client
        self.address = await client.lookup_or(self.topic, self.address)

        async def attempt():
            stub = client.pool.stub(self.address.connect_url)
            request = pb.ProducerRequest(
                request_id=next(self._create_ids), producer_name=self.name,
                topic_name=self.topic, producer_access_mode=pb.Shared,
                dispatch_strategy=self.dispatch)
            if self.schema_ref is not None:
                request.schema_ref.CopyFrom(self.schema_ref)
            return await stub.create_producer(request, timeout=client.rpc_timeout,
                                              metadata=self.address.call_metadata())

        async def relookup():
            self.address = await client.lookup_or(self.topic, self.address)

        response = await client.retry.run(attempt, relookup)
        self.producer_id = response.producer_id
        self._stub = client.pool.stub(self.address.connect_url)
        self._metadata = self.address.call_metadata()
        self._msg_id = pb.MsgID(producer_id=self.producer_id, topic_name=self.topic,
                                broker_addr=self.address.broker_url)
        self.closed_by_broker = False
        self._generation += 1
        self.stop_health()
        self._health = client.watch_health(pb.HealthCheckRequest.Producer, self.producer_id,
                                           self.address, self._on_broker_close)
        if self.schema_ref is not None:
            self.schema_id, self.schema_version = await resolve_schema(
                self._stub, self.schema_ref, client.rpc_timeout)

    def _on_broker_close(self):
        # The broker no longer knows this producer: create it again before the next send.
        self.closed_by_broker = True

    def stop_health(self):
        if self._health is not None:
            self._health.cancel()
            self._health = None

    async def _recreate(self, generation):
        """Create again, once for all the senders that saw the same failure."""
        async with self._lock:
            if self._generation == generation:
                await self.create()

    def _message(self, request_id, payload, attributes, key, publish_time=None):
        msg = pb.StreamMessage(request_id=request_id, msg_id=self._msg_id, payload=payload,
                               publish_time=publish_time or int(time.time() * 1000),
                               producer_name=self.name)
        if attributes:
            msg.attributes.update(attributes)
        if key is not None:
            msg.routing_key = key
        if self.schema_id is not None:
            msg.schema_id = self.schema_id
            msg.schema_version = self.schema_version
        return msg

    def _take_ids(self, n):
        first = self._next_send_id
        self._next_send_id = first + n
        return list(range(first, first + n))

    def _give_back_ids(self, ids):
        # A batch the broker could not take at all (no extension): its ids are reused by
        # the fallback, so the broker sees the producer's ids without a gap.
        if ids and self._next_send_id == ids[-1] + 1:
            self._next_send_id = ids[0]

    def _encode(self, request_id, payload, attributes, key):
        if len(payload) < LARGE_PAYLOAD:
            return self._message(request_id, payload, attributes, key).SerializeToString()
        # Protobuf would copy a large payload twice (into the message, then into its
        # serialization); fields serialized in number order concatenate to the same bytes,
        # so the payload (field 3) is copied once, between the fields before and after it.
        msg = self._message(request_id, b"", attributes, key)
        head = pb.StreamMessage(request_id=msg.request_id, msg_id=msg.msg_id)
        msg.ClearField("request_id")
        msg.ClearField("msg_id")
        return b"".join((head.SerializeToString(), _payload_tag(len(payload)), payload,
                         msg.SerializeToString()))

    async def send_batch(self, payloads, attributes=None, key=None, keys=None,
                         attributes_each=None):
        """Send payloads in order in one danube_ext.BatchProducer call; returns their request
        ids. ``keys``: a routing key per payload (instead of ``key`` for all);
        ``attributes_each``: the attributes of each payload (instead of ``attributes`` for
        all). Raises RpcError (UNIMPLEMENTED from an upstream broker: use `send`)."""
        if self.closed_by_broker:
            await self._recreate(self._generation)
        now = int(time.time() * 1000)
        n = len(payloads)
        first = self._next_send_id
        self._next_send_id = first + n
        ids = range(first, first + n)
        if not attributes and attributes_each is None and key is None and keys is None \
                and self.schema_id is None:
            # Plain payloads: the whole request is encoded in C, no protobuf object per
            # message, and without msg_id and producer_name, which the broker stamps.
            batch = encode_message_batch(payloads, first if n else 0, self.producer_id,
                                         first, now, True)
            send = self._stub.send_messages_raw
        else:
            keys = keys if keys is not None else [key] * n
            each = attributes_each if attributes_each is not None else [attributes] * n
            batch = ext.MessageBatch(request_id=first if n else 0,
                                     producer_id=self.producer_id,
                                     messages=[self._message(i, p.encode() if isinstance(p, str)
                                                             else p, a, k, now)
                                               for i, p, k, a in zip(ids, payloads, keys, each)])
            send = self._stub.send_messages
        policy = self.client.retry
        attempt = 0
        while True:
            try:
                await send(batch, timeout=self.client.rpc_timeout, metadata=self._metadata)
                return ids
            except RpcError as exc:
                if exc.code == StatusCode.UNIMPLEMENTED:
                    self._give_back_ids(ids)
                # Retrying is only safe when nothing of the batch was published.
                if not policy.retryable(exc) or attempt >= policy.max_retries:
                    raise
            await asyncio.sleep(policy.backoff(attempt))
            attempt += 1

    async def send(self, payload, attributes=None, key=None):
        """Send one message; returns the request id the broker acknowledged. Raises
        RpcError once retries (and one re-creation of the producer) are exhausted."""
        if self.closed_by_broker:
            await self._recreate(self._generation)
        policy = self.client.retry
        request_id = self._take_ids(1)[0]
        attempt = 0
        recreated = False
        while True:
            generation = self._generation
            data = self._encode(request_id, payload, attributes, key)
            try:
                response = await self._stub.send_message(
                    data, timeout=self.client.rpc_timeout, metadata=self._metadata)
                return response.request_id
            except RpcError as exc:
                # NOT_FOUND: the broker lost this producer (restart, topic unloaded or
                # moved); the reference clients recreate it after a health CLOSE, we do it
                # as soon as a send tells us. UNAVAILABLE: the topic moved ("look it up
                # again") or its broker is gone; the reference clients send to the same
                # broker 5 times more first (1.5-3 s of backoff, the whole publish gap of
                # a graceful drain), we look it up and create the producer again at once.
                lost = exc.code == StatusCode.NOT_FOUND
                moved = exc.code == StatusCode.UNAVAILABLE and not recreated
                if not (lost or policy.retryable(exc)):
                    raise
                if lost or moved or attempt >= policy.max_retries:
                    if recreated:
                        raise
                    await self._recreate(generation)
                    recreated, attempt = True, 0
                    continue
            await asyncio.sleep(policy.backoff(attempt))
            attempt += 1


class Producer:
    """`await client.create_producer(topic, name, partitions=None, reliable=False)`."""

    def __init__(self, client, topic, name, partitions=None, reliable=False, schema=None):
        if not name:
            raise errors.InvalidArgument("a producer needs a name")
        if partitions is not None and partitions < 1:
            raise errors.InvalidArgument("partitions must be at least 1")
        self.client = client
        self.topic = topic
        self.name = name
        self.partitions = partitions
        dispatch = pb.Reliable if reliable else pb.NonReliable
        if partitions is None:
            self.producers = [TopicProducer(client, topic, name, dispatch, schema)]
        else:
            self.producers = [TopicProducer(client, f"{topic}-part-{i}", f"{name}-{i}",
                                            dispatch, schema) for i in range(partitions)]
        self._next = 0
        self._closed = False

    async def _create(self):
        try:
            await asyncio.gather(*(p.create() for p in self.producers))
        except RpcError as exc:
            self._stop_all()
            raise errors.from_rpc(exc, f"create producer {self.name!r} on {self.topic}") from None
        except BaseException:
            self._stop_all()
            raise

    def _pick(self, key):
        n = len(self.producers)
        if n == 1:
            return self.producers[0]
        if key is not None:
            return self.producers[fnv1a64(key) % n]
        index = self._next
        self._next = (index + 1) % n
        return self.producers[index]

    async def send(self, payload, attributes=None, key=None):
        """Send one message (bytes or str) and return its request id. With a `key`, the
        partition is fnv1a64(key) % partitions and the key becomes the routing key."""
        if self._closed:
            raise errors.ClientClosed("the producer is closed")
        if isinstance(payload, str):
            payload = payload.encode()
        producer = self._pick(key)
        try:
            return await producer.send(payload, attributes, key)
        except RpcError as exc:
            raise errors.from_rpc(exc, f"send to {producer.topic}") from None

    async def send_many(self, payloads, attributes=None, key=None, *, keys=None,
                        attributes_each=None, window=DEFAULT_WINDOW, batch_size=DEFAULT_BATCH,
                        on_result=None, return_exceptions=False):
        """Send every payload and return the request ids in payload order. ``keys`` gives
        each payload its own routing key (and partition), instead of ``key`` for all;
        ``attributes_each`` each payload its own attributes, instead of ``attributes``.

        Against this project's broker the payloads go in batches of `batch_size` through
        danube_ext.BatchProducer, one batch at a time per partition, so order is kept per
        partition. Against an upstream broker (UNIMPLEMENTED) it falls back to up to
        `window` SendMessage calls in flight, where messages in flight together may arrive
        in any order. `on_result(index, request_id_or_error)` is called as each completes;
        with `return_exceptions`, failures are returned in place of their ids instead of
        raising the first."""
        if self._closed:
            raise errors.ClientClosed("the producer is closed")
        items = payloads if type(payloads) is list else list(payloads)
        if keys is not None:
            keys = keys if type(keys) is list else list(keys)
            if key is not None or len(keys) != len(items):
                raise ValueError("keys: one per payload, and no key beside them")
            if all(k == keys[0] for k in keys):
                key, keys = (keys[0] if keys else None), None
        if attributes_each is not None:
            attributes_each = attributes_each if type(attributes_each) is list \
                else list(attributes_each)
            if attributes or len(attributes_each) != len(items):
                raise ValueError("attributes_each: one per payload, and no attributes beside")
            if all(a == attributes_each[0] for a in attributes_each):
                attributes, attributes_each = \
                    (attributes_each[0] if attributes_each else None), None
        if self.client.batch_publish is not False and items:
            # Filled in as batches are acknowledged: a failure is reported only for the
            # payloads no acknowledgement covered (each payload has one outcome).
            results = [None] * len(items)
            try:
                return await self._send_batched(items, attributes, key, batch_size, on_result,
                                                keys, results, attributes_each)
            except RpcError as exc:
                if exc.code != StatusCode.UNIMPLEMENTED or any(r is not None for r in results):
                    error = errors.from_rpc(exc, f"send to {self.topic}")
                    if not return_exceptions:
                        raise error from None
                    for index, outcome in enumerate(results):
                        if outcome is None:
                            results[index] = error
                            if on_result is not None:
                                on_result(index, error)
                    return results
                self.client.batch_publish = False
        return await self._send_pipelined(items, attributes, key, window, on_result,
                                          return_exceptions, keys, attributes_each)

    async def _send_batched(self, items, attributes, key, batch_size, on_result, keys,
                            results, attributes_each=None):
        each = attributes_each
        if len(self.producers) == 1 or (key is not None and keys is None):
            # One partition: consecutive slices, nothing to do per message.
            producer = self._pick(key)
            for start in range(0, len(items), batch_size):
                stop = start + batch_size
                ids = await producer.send_batch(
                    items[start:stop], attributes, key,
                    None if keys is None else keys[start:stop],
                    None if each is None else each[start:stop])
                results[start:start + len(ids)] = ids
                if on_result is not None:
                    for index, request_id in enumerate(ids, start):
                        on_result(index, request_id)
            self.client.batch_publish = True
            return results
        # Group by partition, keeping payload order within each, then one batch call at a
        # time per partition.
        groups = {}
        for index in range(len(items)):
            groups.setdefault(self._pick(key if keys is None else keys[index]),
                              []).append(index)

        async def run(producer, indexes):
            for start in range(0, len(indexes), batch_size):
                chunk = indexes[start:start + batch_size]
                ids = await producer.send_batch([items[i] for i in chunk], attributes, key,
                                                None if keys is None else
                                                [keys[i] for i in chunk],
                                                None if each is None else
                                                [each[i] for i in chunk])
                for index, request_id in zip(chunk, ids):
                    results[index] = request_id
                    if on_result is not None:
                        on_result(index, request_id)
        try:
            # A partition that fails stops the others (a TaskGroup cancels them), so no
            # acknowledgement arrives after the failure is reported.
            async with asyncio.TaskGroup() as group:
                for p, idx in groups.items():
                    group.create_task(run(p, idx))
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
        self.client.batch_publish = True
        return results

    async def _send_pipelined(self, items, attributes, key, window, on_result,
                              return_exceptions, keys=None, attributes_each=None):
        results = [None] * len(items)
        pending = iter(enumerate(items))

        async def worker():
            for index, payload in pending:
                try:
                    outcome = await self.send(
                        payload, attributes if attributes_each is None
                        else attributes_each[index], key if keys is None else keys[index])
                except errors.DanubeError as exc:
                    if not return_exceptions:
                        raise
                    outcome = exc
                results[index] = outcome
                if on_result is not None:
                    on_result(index, outcome)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(max(1, min(window, len(items)))):
                    group.create_task(worker())
        except BaseExceptionGroup as group_error:
            # One error is what callers of a send want to see, not a group.
            raise group_error.exceptions[0] from None
        return results

    def _stop_all(self):
        for producer in self.producers:
            producer.stop_health()

    async def close(self):
        if not self._closed:
            self._closed = True
            self._stop_all()
            self.client._forget(self)
