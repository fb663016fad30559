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
from danube.rpc import RpcError, StatusCode
from danube.rpc.target import parse_target

log = logging.getLogger("danube.client")

HEALTH_CHECK_INTERVAL = 5.0     # reference b.7
# What a broker that is down or unreachable answers: try the next service URL.
UNREACHABLE = frozenset({StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED})


class DanubeClient:
    """`DanubeClient("http://127.0.0.1:6650", ssl=None, token=None)`.

    `service_url` may name several brokers of a cluster ("http://a:6650,http://b:6650",
    or a list): lookups use whichever of them answers.

    `ssl` is an ssl.SSLContext for https brokers (an https:// URL without one uses the
    system CAs); `token` is a JWT sent as "authorization: Bearer <token>" on every call;
    `server_hostname` is the name every broker's certificate is checked against, when it is
    not the host of the URL."""

    def __init__(self, service_url, *, ssl=None, token=None, retry=None, rpc_timeout=30.0,
                 connect_timeout=10.0, health_check_interval=HEALTH_CHECK_INTERVAL,
                 server_hostname=None):
        urls = service_url.split(",") if isinstance(service_url, str) else list(service_url)
        urls = [u.strip() for u in urls if u and u.strip()]
        if not urls:
            raise errors.InvalidArgument(f"invalid service URL {service_url!r}: empty")
        for i, url in enumerate(urls):
            try:
                parse_target(url)
            except ValueError as exc:
                raise errors.InvalidArgument(f"invalid service URL {url!r}: {exc}") from None
            if "://" not in url:
                # MsgID.broker_addr and logs carry URLs (http://host:port), as upstream's do.
                urls[i] = ("https://" if ssl is not None else "http://") + url
        # Several service URLs (ours: upstream's clients take one): lookups go to the one
        # that answered last and move on to the next when it cannot be reached, so a
        # client survives the death of the broker it was given first.
        self.service_urls = tuple(urls)
        self._url_index = 0
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

    @property
    def service_url(self):
        """The service URL lookups go to now (the first that answers, of several)."""
        return self.service_urls[self._url_index]

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
            return await self._any_service_url(lambda stub: stub.topic_partitions(
                pb.TopicLookupRequest(request_id=next(self._request_ids), topic=topic),
                timeout=self.rpc_timeout))
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

    async def _any_service_url(self, call):
        """`await call(stub)` on the current service URL; when that broker cannot be
        reached (UNAVAILABLE, DEADLINE_EXCEEDED), on the next ones in turn, keeping the
        first that answers. The last error is raised when none does."""
        n = len(self.service_urls)
        for step in range(n):
            index = (self._url_index + step) % n
            try:
                response = await call(self.pool.stub(self.service_urls[index]))
            except RpcError as exc:
                if step == n - 1 or exc.code not in UNREACHABLE:
                    raise
                log.debug("service URL %s: %s; trying the next", self.service_urls[index], exc)
                continue
            self._url_index = index
            return response

    async def _lookup(self, topic):
        response = await self._any_service_url(lambda stub: stub.topic_lookup(
            pb.TopicLookupRequest(request_id=next(self._request_ids), topic=topic),
            timeout=self.rpc_timeout))
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

