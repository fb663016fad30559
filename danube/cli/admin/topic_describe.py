"""`danube admin topics describe`: upstream's lines and JSON keys, followed by the topic's
statistics from danube_ext.TopicStatsService (JSON: an extra "stats" key). A broker without
that service (upstream's) answers UNIMPLEMENTED and describe shows what upstream shows.
`topics stats` prints the statistics alone (every partition of a partitioned topic)."""

from danube.cli.admin.common import add_command, add_output, add_topic, normalize_topic
from danube.cli.admin.output import debug_list, emit_json, optional, proto_to_dict, rate, \
    size, table
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext


def add_commands(cmds):
    p = add_command(cmds, "describe", _describe,
                    "describe a topic (schema, subscriptions and statistics)",
                    "  danube admin topics describe /default/mytopic --output json")
    add_topic(p)
    add_output(p, "pretty text")
    p = add_command(cmds, "stats", _stats,
                    "a topic's statistics, each partition's for a partitioned topic "
                    "(a danube extension)",
                    "  danube admin topics stats /default/mytopic\n"
                    "  danube admin topics stats /default/orders --output json")
    add_topic(p)
    add_output(p)


async def fetch_stats(admin, name, *, required=False):
    """The TopicStats of ``name`` (each partition's for a partitioned base name), or None
    from a broker that has no statistics service."""
    from danube.client.errors import Unimplemented
    try:
        resp = await admin.call("TopicStatsService", "GetTopicStats",
                                ext.TopicStatsRequest(name=name),
                                what=f"statistics of topic {name}")
    except Unimplemented:
        if required:
            raise
        return None
    return list(resp.topics)


async def _describe(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    info = await admin.call("TopicAdmin", "DescribeTopic", adm.DescribeTopicRequest(name=name),
                            what=f"describe topic {name}")
    stats = await fetch_stats(admin, name)
    mine = next((t for t in stats or () if t.name == info.name), None)
    if args.output == "json":
        out = {"topic": info.name, "broker_id": info.broker_id, "delivery": info.delivery,
               "schema_subject": optional(info, "schema_subject"),
               "schema_id": optional(info, "schema_id"),
               "schema_version": optional(info, "schema_version"),
               "schema_type": optional(info, "schema_type"),
               "compatibility_mode": optional(info, "compatibility_mode"),
               "subscriptions": list(info.subscriptions)}
        if mine is not None:
            out["stats"] = proto_to_dict(mine)
        emit_json(out)
        return
    print(f"Topic: {info.name}")
    if info.broker_id:
        print(f"Broker ID: {info.broker_id}")
    if info.delivery:
        print(f"Delivery: {info.delivery}")
    if info.HasField("schema_subject"):
        print("\n📋 Schema Registry:")
        print(f"  Subject: {info.schema_subject}")
        for field, label in (("schema_id", "Schema ID"), ("schema_version", "Version"),
                             ("schema_type", "Type"), ("compatibility_mode", "Compatibility")):
            if info.HasField(field):
                print(f"  {label}: {getattr(info, field)}")
    else:
        print("\n📋 Schema: None")
    print(f"\nSubscriptions: {debug_list(info.subscriptions)}")
    if mine is not None:
        print()
        print_stats(mine)


async def _stats(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    topics = await fetch_stats(admin, name, required=True)
    if args.output == "json":
        emit_json([proto_to_dict(t) for t in topics])
        return
    for i, topic in enumerate(topics):
        if i:
            print()
        print(f"Topic: {topic.name} (delivery: {topic.delivery}, broker_id: {topic.broker_id})")
        print_stats(topic)


def print_stats(t):
    print("📊 Statistics:")
    print(f"  Published:      {t.messages_in} messages, {size(t.bytes_in)} "
          f"({rate(t.msg_rate_in)}, {size(t.byte_rate_in)}/s)")
    print(f"  Producers:      {t.producers}")
    print(f"  Consumers:      {t.consumers} in {t.subscription_count} subscription(s)")
    print(f"  Backlog:        {t.backlog} (the largest of its subscriptions)")
    if t.HasField("log"):
        _print_log(t.log)
    if t.subscriptions:
        print()
        table(("SUBSCRIPTION", "TYPE", "CONSUMERS", "BACKLOG", "UNACKED", "REDELIVERED",
               "CURSOR", "DELIVERED", "RATE"),
              [(s.name, s.type, s.consumers, s.backlog, s.unacked, s.redelivered,
                "-" if s.cursor < 0 else s.cursor, s.messages_out, rate(s.msg_rate_out))
               for s in t.subscriptions], indent="  ")


def _print_log(log):
    print(f"  Log:            next offset {log.end_offset}, synced below "
          f"{log.synced_end_offset}, durability {log.durability or '-'}")
    print(f"  WAL:            offsets [{log.wal_start_offset}, {log.end_offset}), "
          f"{size(log.wal_bytes)} in {log.wal_segments} segment(s)")
    if log.tiered:
        print(f"  Durable tier:   offsets [{log.tier_start_offset}, {log.tier_end_offset}), "
              f"{size(log.tier_bytes)} in {log.tier_objects} object(s)")
    else:
        print("  Durable tier:   none")
