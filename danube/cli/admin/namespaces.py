"""`danube admin namespaces`: upstream danube-admin's namespaces group (topics, policies,
create, delete) with its output lines and JSON, plus our `stats` (every topic's statistics
from danube_ext.TopicStatsService/ListTopicStats)."""

import json

from danube.cli.admin.common import CommandError, add_command, add_group, add_output
from danube.cli.admin.output import emit_json, proto_to_dict, rate, size, table
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext

# upstream's Policies struct, in its order, with the label of each line of its text output
POLICY_LINES = (
    ("max_producers_per_topic", "Max Producers per Topic: {}", "Max Producers per Topic: Not Set"),
    ("max_subscriptions_per_topic", "Max Subscriptions per Topic: {}",
     "Max Subscriptions per Topic: Not Set"),
    ("max_consumers_per_topic", "Max Consumers per Topic: {}", "Max Consumers per Topic: Not Set"),
    ("max_consumers_per_subscription", "Max Consumers per Subscription: {}",
     "Max Consumers per Subscription: Not Set"),
    ("max_publish_rate", "Max publish rate: {}", "Max publish rate Not Set"),
    ("max_subscription_dispatch_rate", "Dispatch rate for subscription: {}",
     "dispatch rate for subscription Not Set"),
    ("max_message_size", "Max message size: {}", "Max message size Not Set"),
)


def add_parser(groups):
    cmds = add_group(groups, "namespaces", "manage namespaces")
    p = add_command(cmds, "topics", _topics, "list topics in the specified namespace",
                    "  danube admin namespaces topics default\n"
                    "  danube admin namespaces topics my-namespace --output json")
    p.add_argument("namespace")
    add_output(p, "plain")
    p = add_command(cmds, "policies", _policies,
                    "list the configuration policies of a namespace",
                    "  danube admin namespaces policies default --output json")
    p.add_argument("namespace")
    add_output(p, "pretty text")
    p = add_command(cmds, "create", _create, "create a new namespace",
                    "  danube admin namespaces create my-namespace")
    p.add_argument("namespace")
    p = add_command(cmds, "delete", _delete, "delete an empty namespace",
                    "  danube admin namespaces delete my-namespace")
    p.add_argument("namespace")
    p = add_command(cmds, "stats", _stats,
                    "statistics of every topic in a namespace (a danube extension)",
                    "  danube admin namespaces stats default\n"
                    "  danube admin namespaces stats default --output json")
    p.add_argument("namespace")
    add_output(p)


async def _topics(admin, args):
    resp = await admin.call("TopicAdmin", "ListNamespaceTopics",
                            adm.NamespaceRequest(name=args.namespace),
                            what=f"list topics of namespace {args.namespace}")
    names = [t.name for t in resp.topics]
    if args.output == "json":
        emit_json(names)
        return
    for name in names:
        print(f"Topic: {name}")


async def _policies(admin, args):
    resp = await admin.call("NamespaceAdmin", "GetNamespacePolicies",
                            adm.NamespaceRequest(name=args.namespace),
                            what=f"get policies of namespace {args.namespace}")
    try:
        policies = json.loads(resp.policies)
    except ValueError:
        policies = None
    if args.output == "json":
        if policies is None:
            print(resp.policies)
        else:
            emit_json(policies)
        return
    if not isinstance(policies, dict):
        raise CommandError(f"namespace {args.namespace}: the broker's policies are not a "
                           f"JSON object: {resp.policies!r}")
    print("Policies Configuration:")
    print("-----------------------")
    for key, when_set, when_unset in POLICY_LINES:
        value = policies.get(key)
        print(when_unset if value is None else when_set.format(value))
    print("-----------------------")


async def _create(admin, args):
    resp = await admin.call("NamespaceAdmin", "CreateNamespace",
                            adm.NamespaceRequest(name=args.namespace),
                            what=f"create namespace {args.namespace}")
    print(f"Namespace Created: {str(resp.success).lower()}")


async def _delete(admin, args):
    resp = await admin.call("NamespaceAdmin", "DeleteNamespace",
                            adm.NamespaceRequest(name=args.namespace),
                            what=f"delete namespace {args.namespace}")
    print(f"Namespace Deleted: {str(resp.success).lower()}")


async def _stats(admin, args):
    resp = await admin.call("TopicStatsService", "ListTopicStats",
                            ext.ListTopicStatsRequest(namespace=args.namespace),
                            what=f"statistics of namespace {args.namespace}")
    if args.output == "json":
        emit_json([proto_to_dict(t) for t in resp.topics])
        return
    if not resp.topics:
        print(f"No topics in namespace {args.namespace}")
        return
    table(("TOPIC", "DELIVERY", "PUBLISH RATE", "MESSAGES", "BYTES", "PRODUCERS",
           "CONSUMERS", "SUBSCRIPTIONS", "BACKLOG"),
          [(t.name, t.delivery, rate(t.msg_rate_in), t.messages_in, size(t.bytes_in),
            t.producers, t.consumers, t.subscription_count, t.backlog) for t in resp.topics])
