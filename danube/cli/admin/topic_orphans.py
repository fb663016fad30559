"""`danube admin topics republish-orphaned`: publish again what a returning broker's WAL held
that the topic's next owner never had (storage.failover lossy_local_wal; the broker named
them at start in a warning and in `orphaned.json` beside the set-aside WAL,
danube/storage/ownership.py). Run on the returning broker's host: it reads the set-aside WAL
from disk and publishes each message through a reliable producer, at least once, at new
offsets (its payload, attributes and routing key as they were)."""

import asyncio
import json
import os
import sys
import time

from danube.cli.admin.common import CommandError, add_command, normalize_topic
from danube.client.errors import DanubeError

EXAMPLE = ("  danube admin topics republish-orphaned /default/orders "
           "--data-dir /var/lib/danube -s http://127.0.0.1:6650")
#: Messages read from the set-aside WAL at once.
CHUNK = 1000


def add_commands(cmds):
    p = add_command(cmds, "republish-orphaned", None,
                    "publish again what this broker's WAL held that the topic's next owner "
                    "never had (lossy_local_wal)", EXAMPLE)
    p.add_argument("topic", nargs="?",
                   help="topic name ('/ns/topic'; a partitioned topic's partitions too); "
                        "without it, every topic with orphaned messages")
    p.add_argument("--namespace", help="namespace of a topic given without one")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", help="the returning broker's --data-dir (its WAL root "
                                          "is DATA_DIR/wal)")
    where.add_argument("--wal-root", help="the broker's storage.local_wal_root")
    p.add_argument("-s", "--service-url", default="http://127.0.0.1:6650",
                   help="a broker of the cluster, or several, comma-separated "
                        "(default http://127.0.0.1:6650)")
    p.add_argument("--dry-run", action="store_true", help="list what would be published")
    p.set_defaults(func=_run)


def _run(args):
    try:
        return asyncio.run(_republish(args))
    except (DanubeError, CommandError) as exc:
        print(f"danube admin topics republish-orphaned: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _matches(record, topic):
    name = record.get("topic", "")
    return topic is None or name == topic or name.startswith(topic + "-part-")


async def _republish(args):
    from danube.storage.ownership import ORPHANED_FILE, REPUBLISHED_FILE, find_orphaned

    topic = normalize_topic(args.topic, args.namespace) if args.topic else None
    root = args.wal_root or os.path.join(args.data_dir, "wal")
    if not os.path.isdir(root):
        raise CommandError(f"no WAL root at {root}")
    records = [r for r in find_orphaned(root) if _matches(r, topic)]
    if not records:
        print(f"no orphaned messages{' of ' + topic if topic else ''} under {root}")
        return 0
    for r in records:
        print(f"{r['topic']}: offsets {r['first']}..{r['last']} ({r['count']} messages) in "
              f"{r['directory']}")
    if args.dry_run:
        return 0
    from danube.client import DanubeClient

    total = 0
    async with DanubeClient(args.service_url) as client:
        for record in records:
            sent = await _republish_one(client, record)
            total += sent
            done = {**record, "republished": sent, "republished_at": time.time()}
            with open(os.path.join(record["directory"], REPUBLISHED_FILE), "w",
                      encoding="utf-8") as f:
                json.dump(done, f)
            os.remove(os.path.join(record["directory"], ORPHANED_FILE))
            print(f"{record['topic']}: republished {sent} messages")
    print(f"republished {total} messages in all")
    return 0


async def _republish_one(client, record):
    from danube.proto import DanubeApi_pb2 as pb
    from danube.storage.wal import WAL, WALConfig

    producer = await client.create_producer(record["topic"],
                                            f"republish-orphaned-{os.getpid()}", reliable=True)
    wal = await WAL.open(record["directory"], WALConfig(durability="none"))
    sent = 0
    try:
        offset, last = record["first"], record["last"]
        while offset <= last:
            batch = wal.read(offset, min(CHUNK, last - offset + 1))
            if not batch:
                raise CommandError(f"{record['directory']}: offsets {offset}..{last} are not "
                                   f"in the set-aside WAL")
            for at, raw in batch:
                msg = pb.StreamMessage.FromString(bytes(raw))
                key = msg.routing_key if msg.HasField("routing_key") else None
                await producer.send(msg.payload, dict(msg.attributes), key=key)
                sent += 1
                offset = at + 1
    finally:
        await wal.close()
        await producer.close()
    return sent
