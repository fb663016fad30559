"""`danube admin topics`: upstream danube-admin's topics group with its flags, output lines and
JSON keys. Describe (with our statistics) is in topic_describe.py; the failure policy and
the schema configuration in topic_config.py."""

from danube.cli.admin import topic_config, topic_describe, topic_orphans
from danube.cli.admin.common import CommandError, add_command, add_group, add_output, \
    add_topic, normalize_topic, u32
from danube.cli.admin.output import debug_list, emit_json
from danube.proto import DanubeAdmin_pb2 as adm

EXAMPLES = """\
  danube admin topics list --namespace default
  danube admin topics create /default/mytopic
  danube admin topics create /default/mytopic --partitions 3
  danube admin topics describe /default/mytopic"""


def add_parser(groups):
    cmds = add_group(groups, "topics", "manage topics", EXAMPLES)
    p = add_command(cmds, "list", _list, "list topics by namespace or by broker",
                    "  danube admin topics list --namespace default --output json\n"
                    "  danube admin topics list --broker 1234")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--namespace", help="namespace name (e.g. default)")
    which.add_argument("--broker", help="broker id whose topics to list")
    add_output(p, "plain")
    p = add_command(cmds, "create", _create, "create a topic (--partitions: a partitioned one)",
                    "  danube admin topics create /default/mytopic\n"
                    "  danube admin topics create /default/mytopic --dispatch-strategy reliable\n"
                    "  danube admin topics create /default/mytopic --partitions 3\n"
                    "  danube admin topics create mytopic --namespace default "
                    "--schema-subject user-events")
    add_topic(p)
    p.add_argument("--partitions", type=u32, help="number of partitions (a partitioned topic)")
    p.add_argument("--schema-subject", help="schema subject from the schema registry")
    p.add_argument("--dispatch-strategy", default="non_reliable",
                   help="dispatch strategy: non_reliable|reliable (default non_reliable)")
    p = add_command(cmds, "delete", _delete, "delete an existing topic",
                    "  danube admin topics delete /default/mytopic\n"
                    "  danube admin topics delete mytopic --namespace default")
    add_topic(p)
    p = add_command(cmds, "subscriptions", _subscriptions,
                    "list the subscriptions of a topic",
                    "  danube admin topics subscriptions /default/mytopic --output json")
    add_topic(p)
    add_output(p, "plain")
    topic_describe.add_commands(cmds)
    p = add_command(cmds, "unsubscribe", _unsubscribe, "delete a subscription from a topic",
                    "  danube admin topics unsubscribe --subscription sub1 /default/mytopic")
    add_topic(p)
    p.add_argument("-s", "--subscription", required=True)
    topic_config.add_failure_policy_commands(cmds)
    p = add_command(cmds, "unload", _unload,
                    "unload a topic from its broker, to be assigned again",
                    "  danube admin topics unload /default/mytopic")
    add_topic(p)
    topic_config.add_schema_commands(cmds)
    topic_orphans.add_commands(cmds)


def _dispatch_strategy(text):
    # upstream's parse: anything that is not a spelling of reliable is non-reliable
    if text.lower() in ("reliable", "reliable_dispatch", "reliable-dispatch"):
        return adm.Reliable
    return adm.NonReliable


async def _list(admin, args):
    if args.namespace is not None:
        resp = await admin.call("TopicAdmin", "ListNamespaceTopics",
                                adm.NamespaceRequest(name=args.namespace),
                                what=f"list topics of namespace {args.namespace}")
    else:
        resp = await admin.call("TopicAdmin", "ListBrokerTopics",
                                adm.BrokerRequest(broker_id=args.broker),
                                what=f"list topics of broker {args.broker}")
    if args.output == "json":
        emit_json([{"name": t.name, "broker_id": t.broker_id, "delivery": t.delivery}
                   for t in resp.topics])
        return
    for t in resp.topics:
        if t.broker_id:
            print(f"Topic: {t.name} (broker_id: {t.broker_id}, delivery: {t.delivery})")
        else:
            print(f"Topic: {t.name} (delivery: {t.delivery})")


async def _create(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    strategy = _dispatch_strategy(args.dispatch_strategy)
    if args.partitions is not None:
        request = adm.PartitionedTopicRequest(base_name=name, partitions=args.partitions,
                                              dispatch_strategy=strategy)
        call, label = "CreatePartitionedTopic", "Partitioned topic"
    else:
        request = adm.NewTopicRequest(name=name, dispatch_strategy=strategy)
        call, label = "CreateTopic", "Topic"
    if args.schema_subject is not None:
        request.schema_subject = args.schema_subject
    resp = await admin.call("TopicAdmin", call, request, what=f"create topic {name}")
    if not resp.success:
        raise CommandError(f"create topic {name}: the broker did not create it")
    print(f"✅ {label} created: {name}")
    if args.schema_subject is not None:
        print(f"   Schema subject: {args.schema_subject}")
    if args.partitions is not None:
        print(f"   Partitions: {args.partitions}")


async def _delete(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    resp = await admin.call("TopicAdmin", "DeleteTopic", adm.TopicRequest(name=name),
                            what=f"delete topic {name}")
    print(f"Topic Deleted: {str(resp.success).lower()}")


async def _subscriptions(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    resp = await admin.call("TopicAdmin", "ListSubscriptions", adm.TopicRequest(name=name),
                            what=f"list subscriptions of {name}")
    if args.output == "json":
        emit_json(list(resp.subscriptions))
    else:
        print(f"Subscriptions: {debug_list(resp.subscriptions)}")


async def _unsubscribe(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    resp = await admin.call("TopicAdmin", "Unsubscribe", adm.SubscriptionRequest(
        topic=name, subscription=args.subscription),
        what=f"unsubscribe {args.subscription} from {name}")
    print(f"Unsubscribed: {str(resp.success).lower()}")


async def _unload(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    resp = await admin.call("TopicAdmin", "UnloadTopic", adm.TopicRequest(name=name),
                            what=f"unload topic {name}")
    print(f"Topic Unloaded: {str(resp.success).lower()}")
