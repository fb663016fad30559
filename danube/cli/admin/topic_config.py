"""The `danube admin topics` commands that configure a topic: a subscription's failure policy
(TopicAdmin) and the topic's schema binding and validation (SchemaRegistry on the admin
port), with upstream's flags, lines and JSON keys."""

from danube.cli.admin.common import CommandError, add_command, add_output, add_topic, \
    normalize_topic, u32, u64
from danube.cli.admin.output import emit_json
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr

POISON = {"dead_letter": adm.DeadLetter, "dead-letter": adm.DeadLetter, "block": adm.Block,
          "drop": adm.Drop}
BACKOFF = {"fixed": adm.Fixed, "exponential": adm.Exponential}
POLICIES = ("none", "warn", "enforce")


def add_failure_policy_commands(cmds):
    p = add_command(cmds, "set-failure-policy", _set_failure_policy,
                    "set a subscription's redelivery and poison-message policy",
                    "  danube admin topics set-failure-policy /default/t -s sub1 "
                    "--max-redelivery-count 5 --ack-timeout-ms 30000 \\\n"
                    "      --base-redelivery-delay-ms 1000 --max-redelivery-delay-ms 60000 "
                    "--backoff-strategy exponential --poison-policy dead_letter \\\n"
                    "      --dead-letter-topic /default/t-dlq")
    add_topic(p)
    p.add_argument("-s", "--subscription", required=True)
    p.add_argument("--max-redelivery-count", type=u32, required=True)
    p.add_argument("--ack-timeout-ms", type=u64, required=True)
    p.add_argument("--base-redelivery-delay-ms", type=u64, required=True)
    p.add_argument("--max-redelivery-delay-ms", type=u64, required=True)
    p.add_argument("--backoff-strategy", choices=tuple(BACKOFF), default="fixed",
                   help="default fixed")
    p.add_argument("--dead-letter-topic")
    p.add_argument("--poison-policy", choices=tuple(POISON), required=True)
    p = add_command(cmds, "get-failure-policy", _get_failure_policy,
                    "show a subscription's redelivery and poison-message policy",
                    "  danube admin topics get-failure-policy /default/t -s sub1 --output json")
    add_topic(p)
    p.add_argument("-s", "--subscription", required=True)
    add_output(p, "pretty text")


def add_schema_commands(cmds):
    p = add_command(cmds, "configure-schema", _configure_schema,
                    "bind a schema subject to a topic and set its validation policy",
                    "  danube admin topics configure-schema /default/user-events --subject "
                    "user-events-value \\\n      --validation-policy enforce "
                    "--enable-payload-validation")
    add_topic(p)
    p.add_argument("--subject", required=True, help="schema subject name")
    p.add_argument("--validation-policy", choices=POLICIES, default="none",
                   help="default none")
    p.add_argument("--enable-payload-validation", action="store_true",
                   help="also validate each payload against the schema")
    p = add_command(cmds, "set-validation-policy", _set_validation_policy,
                    "change a topic's validation policy",
                    "  danube admin topics set-validation-policy /default/user-events "
                    "--policy warn")
    add_topic(p)
    p.add_argument("--policy", choices=POLICIES, required=True)
    p.add_argument("--enable-payload-validation", action="store_true",
                   help="also validate each payload against the schema")
    p = add_command(cmds, "get-schema-config", _get_schema_config,
                    "show a topic's schema binding and validation policy",
                    "  danube admin topics get-schema-config /default/user-events --output json")
    add_topic(p)
    add_output(p, "plain")


def _backoff_label(value):
    return "exponential" if value == adm.Exponential else "fixed"


def _poison_label(value):
    return {adm.DeadLetter: "dead_letter", adm.Drop: "drop"}.get(value, "block")


async def _set_failure_policy(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    policy = adm.SubscriptionFailurePolicy(
        max_redelivery_count=args.max_redelivery_count, ack_timeout_ms=args.ack_timeout_ms,
        base_redelivery_delay_ms=args.base_redelivery_delay_ms,
        max_redelivery_delay_ms=args.max_redelivery_delay_ms,
        backoff_strategy=BACKOFF[args.backoff_strategy],
        poison_policy=POISON[args.poison_policy])
    if args.dead_letter_topic is not None:
        policy.dead_letter_topic = args.dead_letter_topic
    resp = await admin.call("TopicAdmin", "SetSubscriptionFailurePolicy",
                            adm.SetSubscriptionFailurePolicyRequest(
                                topic=name, subscription=args.subscription,
                                failure_policy=policy),
                            what=f"set the failure policy of {name} subscription "
                                 f"{args.subscription}")
    if not resp.success:
        raise CommandError(f"set the failure policy of {name} subscription "
                           f"{args.subscription}: the broker did not apply it")
    print(f"✅ Failure policy updated for topic '{name}' subscription '{args.subscription}'")


async def _get_failure_policy(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    what = f"get the failure policy of {name} subscription {args.subscription}"
    resp = await admin.call("TopicAdmin", "GetSubscriptionFailurePolicy",
                            adm.GetSubscriptionFailurePolicyRequest(
                                topic=name, subscription=args.subscription), what=what)
    if not resp.HasField("failure_policy"):
        raise CommandError(f"{what}: subscription failure policy not found")
    fp = resp.failure_policy
    dead_letter = fp.dead_letter_topic if fp.HasField("dead_letter_topic") else None
    if args.output == "json":
        emit_json({"topic": name, "subscription": args.subscription,
                   "max_redelivery_count": fp.max_redelivery_count,
                   "ack_timeout_ms": fp.ack_timeout_ms,
                   "base_redelivery_delay_ms": fp.base_redelivery_delay_ms,
                   "max_redelivery_delay_ms": fp.max_redelivery_delay_ms,
                   "backoff_strategy": _backoff_label(fp.backoff_strategy),
                   "dead_letter_topic": dead_letter,
                   "poison_policy": _poison_label(fp.poison_policy)})
        return
    print(f"Topic: {name}")
    print(f"Subscription: {args.subscription}")
    print(f"Max Redelivery Count: {fp.max_redelivery_count}")
    print(f"Ack Timeout Ms: {fp.ack_timeout_ms}")
    print(f"Base Redelivery Delay Ms: {fp.base_redelivery_delay_ms}")
    print(f"Max Redelivery Delay Ms: {fp.max_redelivery_delay_ms}")
    print(f"Backoff Strategy: {_backoff_label(fp.backoff_strategy)}")
    if dead_letter is not None:
        print(f"Dead Letter Topic: {dead_letter}")
    print(f"Poison Policy: {_poison_label(fp.poison_policy)}")


def _enabled(flag):
    return "ENABLED" if flag else "DISABLED"


async def _configure_schema(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    policy = args.validation_policy.upper()
    resp = await admin.call("SchemaRegistry", "ConfigureTopicSchema",
                            sr.ConfigureTopicSchemaRequest(
                                topic_name=name, schema_subject=args.subject,
                                validation_policy=policy,
                                enable_payload_validation=args.enable_payload_validation),
                            what=f"configure the schema of {name}")
    if not resp.success:
        print(f"❌ Failed to configure schema for topic '{name}'")
        if resp.message:
            print(f"Error: {resp.message}")
        return 1
    print(f"✅ Schema configuration set for topic '{name}'")
    print(f"   Schema Subject: {args.subject}")
    print(f"   Validation Policy: {policy}")
    print(f"   Payload Validation: {_enabled(args.enable_payload_validation)}")


async def _set_validation_policy(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    policy = args.policy.upper()
    resp = await admin.call("SchemaRegistry", "UpdateTopicValidationPolicy",
                            sr.UpdateTopicValidationPolicyRequest(
                                topic_name=name, validation_policy=policy,
                                enable_payload_validation=args.enable_payload_validation),
                            what=f"set the validation policy of {name}")
    if not resp.success:
        print(f"❌ Failed to update validation policy for topic '{name}'")
        if resp.message:
            print(f"Error: {resp.message}")
        return 1
    print(f"✅ Validation policy updated for topic '{name}'")
    print(f"   Policy: {policy}")
    print(f"   Payload Validation: {_enabled(args.enable_payload_validation)}")


async def _get_schema_config(admin, args):
    name = normalize_topic(args.topic, args.namespace)
    cfg = await admin.call("SchemaRegistry", "GetTopicSchemaConfig",
                           sr.GetTopicSchemaConfigRequest(topic_name=name),
                           what=f"get the schema configuration of {name}")
    if args.output == "json":
        emit_json({"topic": name, "schema_subject": cfg.schema_subject,
                   "validation_policy": cfg.validation_policy.upper(),
                   "enable_payload_validation": cfg.enable_payload_validation,
                   "schema_id": cfg.schema_id})
        return
    print(f"Topic: {name}")
    if not cfg.schema_subject:
        print("No schema configured for this topic")
        return
    print(f"Schema Subject: {cfg.schema_subject}")
    print(f"Validation Policy: {cfg.validation_policy.upper()}")
    print(f"Payload Validation: {_enabled(cfg.enable_payload_validation)}")
    if cfg.schema_id > 0:
        print(f"Cached Schema ID: {cfg.schema_id}")
