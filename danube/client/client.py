"""DanubeClient: the entry point. It owns the connection pool, topic lookup, and every
background task its producers and consumers start (health checks, receive loops), so one
`await client.close()` stops everything."""

import asyncio
import itertools
import logging

from danube.client import errors
from danube.client.connection import BrokerAddress, ConnectionPool
from danube.client.consumer import Consumer
from danube.client.producer import Producer
from danube.client.retry import RetryPolicy
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc import RpcError
from danube.rpc.target import parse_target

log = logging.getLogger("danube.client")

HEALTH_CHECK_INTERVAL = 5.0     # reference b.7


class DanubeClient:
    """`DanubeClient("http://127.0.0.1:6650", ssl=None, token=None)`.

    `ssl` is an ssl.SSLContext for https brokers (an https:// URL without one uses the
    system CAs); `token` is a JWT sent as "authorization: Bearer <token>" on every call;
    `server_hostname` is the name every broker's certificate is checked against, when it is
    not the host of the URL."""

    def __init__(self, service_url, *, ssl=None, token=None, retry=None, rpc_timeout=30.0,
                 connect_timeout=10.0, health_check_interval=HEALTH_CHECK_INTERVAL,
                 server_hostname=None):
        try:
            parse_target(service_url)
        except ValueError as exc:
            raise errors.InvalidArgument(f"invalid service URL {service_url!r}: {exc}") from None
        if "://" not in service_url:
            # MsgID.broker_addr and logs carry URLs (http://host:port), as upstream's do.
            service_url = ("https://" if ssl is not None else "http://") + service_url
        self.service_url = service_url
        self.pool = ConnectionPool(ssl=ssl, token=token, connect_timeout=connect_timeout,
                                   server_hostname=server_hostname)
        self.retry = retry or RetryPolicy()
        self.rpc_timeout = rpc_timeout
        self.health_check_interval = health_check_interval
        self._request_ids = itertools.count(1)
        self._tasks = set()
        self._members = set()       # open producers and consumers
        self._closed = False
        # Whether the broker has danube_ext.BatchProducer: None until a send_many finds out.
        self.batch_publish = None

    # -- public API ----------------------------------------------------------------------

    async def create_producer(self, topic, name, partitions=None, reliable=False, schema=None):
        """A producer on `topic` (or, with `partitions=N`, on `{topic}-part-0..N-1`, with
        per-partition producers named `{name}-{i}`). `schema` is an optional
        DanubeApi_pb2.SchemaReference."""
        self._check_open()
        producer = Producer(self, topic, name, partitions, reliable, schema)
        await producer._create()
        self._members.add(producer)
        return producer

    async def subscribe(self, topic, consumer_name, subscription, sub_type="shared",
                        key_filters=(), queue_size=1000, **options):
        """A consumer subscribed to every partition of `topic`; `options` as Consumer's
        (max_unacked_messages, batch_acks, ack_batch, ack_delay)."""
        self._check_open()
        consumer = Consumer(self, topic, consumer_name, subscription, sub_type, key_filters,
                            queue_size, **options)
        await consumer._subscribe()
        self._members.add(consumer)
        return consumer

    async def lookup(self, topic) -> BrokerAddress:
        """The broker serving `topic` (Redirect and Connect are treated alike)."""
        try:
            return await self._lookup(topic)
        except RpcError as exc:
            raise errors.from_rpc(exc, f"lookup of {topic}") from None

    async def partitions(self, topic):
        """`[topic]` for a plain topic, its `-part-N` topics for a partitioned one, or []."""
        async def call():
            stub = self.pool.stub(self.service_url)
            return await stub.topic_partitions(
                pb.TopicLookupRequest(request_id=next(self._request_ids), topic=topic),
                timeout=self.rpc_timeout)
        try:
            response = await self.retry.run(call)
        except RpcError as exc:
            raise errors.from_rpc(exc, f"partitions of {topic}") from None
        return list(response.partitions)

    async def close(self):
        if self._closed:
            return
        self._closed = True
        for member in list(self._members):
            await member.close()
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # -- for producers and consumers -----------------------------------------------------

    def next_request_id(self):
        return next(self._request_ids)

    def spawn(self, coro, name=None):
        """Start a background task owned by this client: cancelled and awaited by close()."""
        self._check_open()
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _forget(self, member):
        self._members.discard(member)

    def _check_open(self):
        if self._closed:
            raise errors.ClientClosed("the client is closed")

    async def _lookup(self, topic):
        stub = self.pool.stub(self.service_url)
        response = await stub.topic_lookup(
            pb.TopicLookupRequest(request_id=next(self._request_ids), topic=topic),
            timeout=self.rpc_timeout)
        if response.response_type == pb.TopicLookupResponse.Failed:
            raise errors.NotFound(f"lookup of {topic} failed")
        connect_url = response.connect_url or self.service_url
        broker_url = response.broker_url or connect_url
        return BrokerAddress(connect_url, broker_url, response.proxy)

    async def lookup_or(self, topic, current):
        """Lookup for (re)connecting; errors are ignored as upstream does, keeping
        `current`, because the call that follows reports the real problem."""
        try:
            return await self._lookup(topic)
        except (RpcError, errors.DanubeError) as exc:
            log.debug("lookup of %s failed (%s); keeping %s", topic, exc, current.connect_url)
            return current

    def watch_health(self, kind, client_id, address, on_close):
        """Every health_check_interval, ask the broker whether producer/consumer `client_id`
        is still served; call `on_close()` once if it answers CLOSE."""
        return self.spawn(self._health_loop(kind, client_id, address, on_close),
                          name=f"danube-health-{client_id}")

    async def _health_loop(self, kind, client_id, address, on_close):
        stub = self.pool.stub(address.connect_url)
        metadata = address.call_metadata()
        while True:
            await asyncio.sleep(self.health_check_interval)
            request = pb.HealthCheckRequest(request_id=next(self._request_ids), client=kind,
                                            id=client_id)
            try:
                response = await stub.health_check(request, timeout=self.rpc_timeout,
                                                   metadata=metadata)
            except RpcError as exc:
                # As upstream: a broken health RPC ends the loop; send and stream errors
                # drive the recovery from here.
                log.debug("health check of %d stopped: %s", client_id, exc)
                return
            if response.status == pb.HealthCheckResponse.CLOSE:
                on_close()
                return

