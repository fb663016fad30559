"""A producer and a consumer that carry on through broker failures, for the cluster's
failover tests and benchmark: each runs on a thread over plain grpcio and, whenever a call
fails, looks the topic up again through any broker still alive and starts over on the owner.

The official clients look a topic up again only through the broker they last talked to,
which a killed broker can no longer answer; these ask the cluster's other brokers instead,
which is what a client given several service URLs does.

The producer records every payload whose publish was acknowledged (``acked``) and resends a
publish that failed, so the guarantee under test is at-least-once: every acknowledged
payload must reach the consumer. The consumer acknowledges what it receives, and records
every payload (``received``, duplicates included).
"""

from __future__ import annotations

import threading
import time

import grpc

from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import unary

RETRY = 0.05


def _lookup(addr: str, topic: str) -> str:
    with grpc.insecure_channel(addr) as ch:
        answer = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=2)
    # broker_url: the owner itself, also when the brokers advertise an ingress as their
    # connect_url (proxy mode), which would need the routing header on every call.
    return answer.broker_url.split("://", 1)[-1]


class _Resilient(threading.Thread):
    creates = False         # may the topic be missing (created by attach)?

    def __init__(self, cluster, topic: str):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.topic = topic
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.reconnects = 0
        self.connected_at: list[float] = []   # monotonic times of each (re)connection
        self.channel = None

    def owner(self) -> str:
        """The owner's address, asked of the live brokers in turn until one knows it; a
        live broker if every one says the topic does not exist (yet: creating it there
        places it)."""
        while not self.stopping.is_set():
            live = self.cluster.live
            codes = set()
            for broker in live:
                try:
                    return _lookup(broker.client_addr, self.topic)
                except grpc.RpcError as exc:
                    codes.add(exc.code())
                    self.errors.append(f"lookup: {exc.code().name}")
            if live and codes == {grpc.StatusCode.NOT_FOUND} and self.creates:
                return live[0].client_addr
            time.sleep(RETRY)
        raise InterruptedError

    def reconnect(self) -> None:
        while not self.stopping.is_set():
            if self.channel is not None:
                self.channel.close()
            self.address = self.owner()
            self.channel = grpc.insecure_channel(self.address)
            try:
                self.attach()
                self.reconnects += 1
                self.connected_at.append(time.monotonic())
                return
            except grpc.RpcError as exc:
                self.errors.append(f"attach: {exc.code().name}")
                time.sleep(RETRY)
        raise InterruptedError

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        if self.channel is not None:
            self.channel.close()


class ResilientProducer(_Resilient):
    creates = True

    def __init__(self, cluster, topic: str, *, delivery=pb.Reliable, interval: float = 0.005,
                 prefix: str = "m"):
        """``prefix``: of the payloads (``{prefix}{n}``), so that two producers one after
        the other on a topic send different ones."""
        super().__init__(cluster, topic)
        self.delivery = delivery
        self.prefix = prefix
        self.interval = interval
        self.acked: list[str] = []
        self.ack_times: list[float] = []
        self.acked_via: list[tuple[float, str]] = []    # (wall-clock time, broker address)
        # Cleared: create the producer (and so the topic), then wait for it before sending.
        self.go = threading.Event()
        self.go.set()

    def attach(self) -> None:
        self.producer_id = unary(self.channel, "/danube.ProducerService/CreateProducer",
                                 pb.ProducerResponse)(
            pb.ProducerRequest(producer_name="resilient", topic_name=self.topic,
                               dispatch_strategy=self.delivery), timeout=5).producer_id

    def run(self) -> None:
        seq = 0
        try:
            self.reconnect()
            while not self.go.wait(0.05):
                if self.stopping.is_set():
                    return
            while not self.stopping.is_set():
                payload = f"{self.prefix}{seq}"
                msg = pb.StreamMessage(request_id=seq, payload=payload.encode(),
                                       producer_name="resilient",
                                       msg_id=pb.MsgID(producer_id=self.producer_id,
                                                       topic_name=self.topic))
                try:
                    unary(self.channel, "/danube.ProducerService/SendMessage",
                          pb.MessageResponse)(msg, timeout=5)
                except grpc.RpcError as exc:
                    self.errors.append(f"send: {exc.code().name}")
                    self.reconnect()
                    continue            # the same payload again: at least once
                self.acked.append(payload)
                self.ack_times.append(time.monotonic())
                self.acked_via.append((time.time(), self.address))
                seq += 1
                time.sleep(self.interval)
        except InterruptedError:
            pass


class ResilientConsumer(_Resilient):
    def __init__(self, cluster, topic: str, subscription: str = "s"):
        super().__init__(cluster, topic)
        self.subscription = subscription
        self.received: list[str] = []
        self.by_offset: dict[int, set[str]] = {}     # topic_offset -> payloads seen there
        self._lock = threading.Lock()

    def attach(self) -> None:
        self.consumer_id = unary(self.channel, "/danube.ConsumerService/Subscribe",
                                 pb.ConsumerResponse)(
            pb.ConsumerRequest(topic_name=self.topic, consumer_name="resilient",
                               subscription=self.subscription,
                               subscription_type=pb.ConsumerRequest.Shared),
            timeout=5).consumer_id

    def run(self) -> None:
        try:
            self.reconnect()
            ack = None
            while not self.stopping.is_set():
                stream = self.channel.unary_stream(
                    "/danube.ConsumerService/ReceiveMessages",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=pb.StreamMessage.FromString)(
                    pb.ReceiveRequest(consumer_id=self.consumer_id), timeout=3600)
                ack = unary(self.channel, "/danube.ConsumerService/Ack", pb.AckResponse)
                try:
                    for msg in stream:
                        with self._lock:
                            payload = msg.payload.decode()
                            self.received.append(payload)
                            self.by_offset.setdefault(msg.msg_id.topic_offset,
                                                      set()).add(payload)
                        ack(pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id,
                                          subscription_name=self.subscription), timeout=5)
                        if self.stopping.is_set():
                            stream.cancel()
                            return
                except grpc.RpcError as exc:
                    if self.stopping.is_set():
                        return
                    self.errors.append(f"receive: {exc.code().name}")
                self.reconnect()
        except InterruptedError:
            pass

    def stop(self) -> None:
        self.stopping.set()
        if self.channel is not None:
            self.channel.close()       # ends a stream blocked waiting for messages
        self.join(30)

    def has_all(self, payloads) -> bool:
        with self._lock:
            return set(payloads) <= set(self.received)
