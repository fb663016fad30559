"""Reliable topics survive broker crashes (durability `always`, the default: SendMessage
returns only after the message is fdatasync'ed).

* test_acknowledged_messages_survive_repeated_sigkill: producers (a grpcio subprocess, each
  message sent exactly once, every acknowledged payload recorded and flushed to a file right
  after its ack) keep publishing while the broker is killed with SIGKILL at random moments,
  four times, and restarted on the same data dir (new ports; the producers reconnect). A
  subscription created before the first kill, idle meanwhile, then reads everything with the
  OFFICIAL client: every acknowledged message arrives, offsets are contiguous from 0, nothing
  twice (nothing was ever delivered to it before, so no duplicate is allowed), and each
  sender's messages come in the order it sent them.
* test_torn_wal_tail_is_dropped_on_restart: after a kill, the active WAL segment gets a torn
  or garbage tail; the restarted broker serves the topic with everything acknowledged, and
  new publishes continue at the next offset.
"""

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time

import pytest

import danube
from broker_process import BrokerProcess
from danube.proto import DanubeApi_pb2 as pb
from official_client import broker_url, official_python, run_scenario, unique_topic

PRODUCER = r'''
import asyncio, json, os, sys, time
import grpc
from danube.proto import DanubeApi_pb2 as pb

cfg = json.loads(sys.argv[1])
stats = {"acked": 0, "failed": 0, "connects": 0, "connect_failures": 0}
unacked = []


def read_addr():
    try:
        with open(cfg["addr_file"]) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def stopping():
    return os.path.exists(cfg["stop_file"])


async def producer(p, record):
    name = f"crash-p{p}"
    seqs = [0] * cfg["senders"]
    request_ids = iter(range(1, 1 << 62))
    while not stopping():
        addr = read_addr()
        if addr is None:
            await asyncio.sleep(0.02)
            continue
        channel = grpc.aio.insecure_channel(addr)
        create = channel.unary_unary(
            "/danube.ProducerService/CreateProducer",
            request_serializer=pb.ProducerRequest.SerializeToString,
            response_deserializer=pb.ProducerResponse.FromString)
        send = channel.unary_unary(
            "/danube.ProducerService/SendMessage",
            request_serializer=pb.StreamMessage.SerializeToString,
            response_deserializer=pb.MessageResponse.FromString)
        try:
            resp = await create(pb.ProducerRequest(
                request_id=0, producer_name=name, topic_name=cfg["topic"],
                dispatch_strategy=pb.Reliable), timeout=2)
        except grpc.aio.AioRpcError:
            stats["connect_failures"] += 1
            await channel.close()
            await asyncio.sleep(0.03)
            continue
        stats["connects"] += 1
        msg_id = pb.MsgID(producer_id=resp.producer_id, topic_name=cfg["topic"],
                          broker_addr="http://" + addr)
        broken = asyncio.Event()

        async def sender(k):
            while not broken.is_set() and not stopping():
                n = seqs[k]
                seqs[k] += 1           # every payload is sent once, never retried
                payload = f"p{p}s{k}-{n}"
                msg = pb.StreamMessage(request_id=next(request_ids), msg_id=msg_id,
                                       payload=payload.encode(), producer_name=name,
                                       publish_time=int(time.time() * 1000))
                try:
                    await send(msg, timeout=5)
                except grpc.aio.AioRpcError:
                    stats["failed"] += 1
                    unacked.append(payload)
                    broken.set()
                    return
                record.write(payload + "\n")
                record.flush()
                stats["acked"] += 1

        await asyncio.gather(*(sender(k) for k in range(cfg["senders"])))
        await channel.close()


async def consumer(record):
    """A live consumer on its own subscription: records "<generation> <payload>" for every
    delivery (generation = its connection number), then acks it."""
    generation = 0
    while True:
        addr = read_addr()
        channel = grpc.aio.insecure_channel(addr)
        subscribe = channel.unary_unary(
            "/danube.ConsumerService/Subscribe",
            request_serializer=pb.ConsumerRequest.SerializeToString,
            response_deserializer=pb.ConsumerResponse.FromString)
        receive = channel.unary_stream(
            "/danube.ConsumerService/ReceiveMessages",
            request_serializer=pb.ReceiveRequest.SerializeToString,
            response_deserializer=pb.StreamMessage.FromString)
        ack = channel.unary_unary(
            "/danube.ConsumerService/Ack",
            request_serializer=pb.AckRequest.SerializeToString,
            response_deserializer=pb.AckResponse.FromString)
        acks = set()
        try:
            resp = await subscribe(pb.ConsumerRequest(
                request_id=1, topic_name=cfg["topic"], consumer_name="live",
                subscription=cfg["live_subscription"],
                subscription_type=pb.ConsumerRequest.Exclusive), timeout=2)
            generation += 1
            stats["consumer_connects"] += 1
            async for msg in receive(pb.ReceiveRequest(request_id=2,
                                                       consumer_id=resp.consumer_id)):
                record.write(f"{generation} {msg.payload.decode()}\n")
                record.flush()
                task = asyncio.ensure_future(ack(pb.AckRequest(
                    request_id=msg.request_id, msg_id=msg.msg_id,
                    subscription_name=cfg["live_subscription"]), timeout=5))
                acks.add(task)
                task.add_done_callback(acks.discard)
        except grpc.aio.AioRpcError:
            pass
        finally:
            await asyncio.gather(*list(acks), return_exceptions=True)
            await channel.close()
        await asyncio.sleep(0.03)


async def main():
    stats["consumer_connects"] = 0
    with open(cfg["record_file"], "w") as record, open(cfg["live_file"], "w") as live:
        reading = asyncio.ensure_future(consumer(live))
        await asyncio.gather(*(producer(p, record) for p in range(cfg["producers"])))
        while not os.path.exists(cfg["live_stop_file"]):
            await asyncio.sleep(0.05)
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    print(json.dumps({**stats, "unacked": unacked}), flush=True)


asyncio.run(main())
'''


def write_atomic(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def count_lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def live_payloads(path):
    try:
        return {line.split()[1] for line in path.read_text().splitlines() if " " in line}
    except FileNotFoundError:
        return set()


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def python_env():
    """The environment for a subprocess that must import the same danube package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(danube.__file__)))
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))


def start(config, data):
    return BrokerProcess("--config-file", str(config), data_dir=data).start()


def steps(broker, topic, *step_list):
    return run_scenario("reliable_steps.py", {"url": broker_url(broker), "topic": topic,
                                              "steps": list(step_list)})


def drain(broker, topic, name, subscription, expected, tmp_path, timeout=60):
    expect_file = tmp_path / f"expect-{name}.txt"
    expect_file.write_text("\n".join(expected) + "\n")
    return run_scenario("reliable_drain.py", {
        "url": broker_url(broker), "topic": topic, "name": name, "subscription": subscription,
        "expect_file": str(expect_file), "timeout": timeout - 10, "quiet": 1.0},
        timeout=timeout)


def idle_subscription(name, subscription):
    """reliable_steps steps: subscribe, then close at once (the subscription stays)."""
    return [{"op": "subscribe", "as": name, "name": name, "subscription": subscription,
             "kind": "exclusive", "plan": {}, "new_client": True},
            {"op": "close", "as": name}]


@pytest.fixture
def config(tmp_path):
    official_python()
    path = tmp_path / "broker.yml"
    # A wide window so that the final drain of thousands of messages is quick.
    path.write_text("dispatch:\n  max_unacked_messages: 500\n")
    return path


def test_acknowledged_messages_survive_repeated_sigkill(tmp_path, config):
    rounds = 4
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    data = tmp_path / "data"
    topic = unique_topic("crash")
    addr_file, record_file, stop_file, live_file, live_stop_file = (
        tmp_path / n for n in ("addr", "acked", "stop", "live", "live-stop"))
    broker = start(config, data)
    producer = None
    errors = open(tmp_path / "producer.err", "w")
    try:
        # Both subscriptions exist (cursor before offset 0) before anything is published:
        # crash-sub stays idle until the end, live-sub is read all along by a consumer in the
        # producers' process.
        setup = steps(broker, topic, *idle_subscription("reader", "crash-sub"),
                      *idle_subscription("live", "live-sub"))
        assert setup["errors"] == {"reader": [], "live": []}
        write_atomic(addr_file, broker.client_addr)
        producer = subprocess.Popen(
            [sys.executable, "-P", "-c", PRODUCER, json.dumps({
                "addr_file": str(addr_file), "record_file": str(record_file),
                "stop_file": str(stop_file), "topic": topic, "producers": 2, "senders": 4,
                "live_file": str(live_file), "live_stop_file": str(live_stop_file),
                "live_subscription": "live-sub"})],
            stdout=subprocess.PIPE, stderr=errors,
            text=True, env=python_env())
        kills = []
        for _ in range(rounds):
            before = count_lines(record_file)
            wait_until(lambda: count_lines(record_file) > before + 20, 15,
                       "the producers to make progress after a restart")
            time.sleep(rng.uniform(0.3, 1.5))
            broker.stop(signal.SIGKILL)
            kills.append(count_lines(record_file))
            broker = start(config, data)
            write_atomic(addr_file, broker.client_addr)
        before = count_lines(record_file)
        wait_until(lambda: count_lines(record_file) > before + 20, 15,
                   "the producers to make progress after the last restart")
        stop_file.write_text("stop")
        time.sleep(0.3)

        def live_caught_up():
            return set(record_file.read_text().split()) <= live_payloads(live_file)
        caught_up = True
        try:
            wait_until(live_caught_up, 15, "the live consumer to catch up")
        except AssertionError:
            caught_up = False
        live_stop_file.write_text("stop")
        out, _ = producer.communicate(timeout=20)
        assert producer.returncode == 0, (tmp_path / "producer.err").read_text()
        stats = json.loads(out.strip().splitlines()[-1])
        producer = None
        acked = record_file.read_text().split()
        assert len(acked) == stats["acked"] == len(set(acked))
        assert stats["connects"] >= rounds + 1

        # On disk (one more kill): every acknowledged message once, offsets contiguous.
        broker.stop(signal.SIGKILL)
        logged = wal_messages(data, topic)
        assert [o for o, _ in logged] == list(range(len(logged)))
        on_disk = [p for _, p in logged]
        assert len(on_disk) == len(set(on_disk)), "a message is in the log twice"
        lost = set(acked) - set(on_disk)
        assert not lost, f"{len(lost)} acknowledged messages are not in the WAL (seed {seed})"
        broker = start(config, data)

        # Through the subscription made before the first kill, with the official client.
        result = drain(broker, topic, "reader", "crash-sub", acked, tmp_path)
        received = [p for p, _ in result["received"]]
        offsets = [o for _, o in result["received"]]
        missing = set(acked) - set(received)
        assert not missing, (f"{len(missing)} acknowledged messages (all in the WAL) were not "
                             f"delivered through the subscription made before the first kill "
                             f"(seed {seed}), e.g. {sorted(missing)[:5]}; "
                             f"{len(received)} delivered")
        assert result["complete"]
        assert len(received) == len(set(received)), "a message was delivered twice"
        assert offsets == list(range(len(offsets))), "offsets are not contiguous from 0"
        # Each sender sent one message at a time: its messages are in the log in that order.
        by_sender = {}
        for payload in received:
            sender, _, n = payload.rpartition("-")
            by_sender.setdefault(sender, []).append(int(n))
        assert all(seq == sorted(seq) for seq in by_sender.values())
        extra = set(received) - set(acked)
        assert extra <= set(stats["unacked"]), "a message nobody sent was delivered"
        assert not result["ack_errors"]
        assert received == on_disk

        # The live consumer, killed under four times: at least once, and a message came twice
        # only after a restart (its ack may not have reached the persisted cursor), never
        # twice from one broker.
        live = [line.split() for line in live_file.read_text().splitlines()]
        missed = set(acked) - {p for _, p in live}
        assert caught_up and not missed, (f"the live subscription missed {len(missed)} "
                                          f"acknowledged messages, e.g. {sorted(missed)[:5]}")
        by_generation = {}
        for generation, payload in live:
            by_generation.setdefault(generation, []).append(payload)
        for generation, payloads in by_generation.items():
            assert len(payloads) == len(set(payloads)), f"duplicate within connection {generation}"
        assert {p for _, p in live} - set(acked) <= set(stats["unacked"])
        redelivered = len(live) - len({p for _, p in live})
        print(f"\ncrash test (seed {seed}): {rounds} SIGKILLs at {kills} acknowledged; "
              f"{len(acked)} acknowledged messages, all {len(acked)} verified in the WAL "
              f"and through the subscription; "
              f"{len(received)} delivered in total ({len(extra)} of the "
              f"{len(stats['unacked'])} sends cut by a kill were stored too); "
              f"{stats['connects']} producer connections; live consumer: {len(live)} "
              f"deliveries over {stats['consumer_connects']} connections, "
              f"{redelivered} redelivered after a restart")
    finally:
        if producer is not None:
            producer.kill()
            producer.communicate()
        errors.close()
        broker.stop(signal.SIGKILL)


# -- torn WAL tail ---------------------------------------------------------------------------

HEADER = struct.Struct("<QII")


def wal_segments(data, topic):
    ns, name = topic.strip("/").split("/")
    directory = data / "wal" / ns / name
    return sorted(p for p in directory.iterdir() if p.name.startswith("wal.") and
                  p.name.endswith(".log"))


def frames(path):
    """[(offset, payload)] of the well-formed frames at the start of a segment, and the
    position where they end (CRCs are not checked here: the broker wrote them)."""
    buf = path.read_bytes()
    out, pos = [], 0
    while pos + HEADER.size <= len(buf):
        offset, length, crc = HEADER.unpack_from(buf, pos)
        if (offset, length, crc) == (0, 0, 0) or pos + HEADER.size + length > len(buf):
            break
        if out and offset != out[-1][0] + 1:
            break
        out.append((offset, buf[pos + HEADER.size:pos + HEADER.size + length]))
        pos += HEADER.size + length
    return out, pos


def wal_messages(data, topic):
    """[(offset, payload text)] of every frame in the topic's WAL, segment by segment."""
    return [(offset, pb.StreamMessage.FromString(raw).payload.decode())
            for seg in wal_segments(data, topic) for offset, raw in frames(seg)[0]]


def damage(path, end, next_offset, how):
    with open(path, "r+b") as f:
        if how == "torn_frame":
            # A frame whose header made it but whose payload did not (the zero-filled
            # preallocated rest of the file), CRC of the full payload.
            f.seek(end)
            f.write(HEADER.pack(next_offset, 300, 0x12345678) + os.urandom(40))
        elif how == "truncated_frame":
            # The file ends in the middle of a frame's payload.
            f.seek(end)
            f.write(HEADER.pack(next_offset, 300, 0x12345678) + os.urandom(40))
            f.truncate(end + HEADER.size + 40)
        elif how == "half_header":
            f.seek(end)
            f.write(struct.pack("<Q", next_offset)[:7])
            f.truncate(end + 7)
        else:  # garbage: random bytes after the last frame
            f.seek(end)
            f.write(os.urandom(4096))


@pytest.mark.parametrize("how", ["torn_frame", "truncated_frame", "half_header", "garbage"])
def test_torn_wal_tail_is_dropped_on_restart(tmp_path, config, how):
    data = tmp_path / "data"
    topic = unique_topic(f"torn-{how.replace('_', '-')}")
    first = [f"t{i}" for i in range(25)]
    more = [f"t{i}" for i in range(25, 35)]
    broker = start(config, data)
    try:
        result = steps(broker, topic, *idle_subscription("old", "torn-sub"),
                       {"op": "produce", "payloads": first, "keys": None})
        assert len(result["send_results"]) == len(first)
        broker.stop(signal.SIGKILL)

        segments = wal_segments(data, topic)
        active = segments[-1]
        stored, end = frames(active)
        assert [o for o, _ in stored][-1] == len(first) - 1
        damage(active, end, len(first), how)

        broker = start(config, data)
        # A new subscription first: new publishes must continue right after the last
        # acknowledged offset.
        after = steps(broker, topic, *idle_subscription("new", "new-sub")[:1],
                      {"op": "produce", "payloads": more, "keys": None},
                      {"op": "wait", "as": "new", "payloads": more, "attempts": 1,
                       "timeout": 10})
        got = after["deliveries"]["new"]
        assert [(d["payload"], d["topic_offset"]) for d in got] == \
            [(p, i) for i, p in enumerate(more, len(first))]
        broker.stop(signal.SIGKILL)

        # On disk: every offset once, in order, with its payload.
        logged = wal_messages(data, topic)
        assert logged == list(enumerate(first + more))

        # The subscription from before the damage still has everything.
        broker = start(config, data)
        old = drain(broker, topic, "old", "torn-sub", first + more, tmp_path, timeout=30)
        assert old["received"] == [[p, i] for i, p in enumerate(first + more)], \
            "the subscription made before the damage did not resume at its cursor"
    finally:
        broker.stop(signal.SIGKILL)
