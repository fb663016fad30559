"""`danube admin brokers`: upstream danube-admin's brokers group (list, leader-broker,
namespaces, unload, activate, balance, rebalance) with its output lines and JSON keys."""

import sys

from danube.cli.admin.common import add_command, add_group, add_output, u32
from danube.cli.admin.output import emit_json, table
from danube.proto import DanubeAdmin_pb2 as adm

BANNER = "═" * 58


def add_parser(groups):
    cmds = add_group(groups, "brokers", "manage brokers in the cluster")
    p = add_command(cmds, "list", _list, "list all active brokers in the cluster",
                    "  danube admin brokers list\n  danube admin brokers list --output json")
    add_output(p)
    add_command(cmds, "leader-broker", _leader, "show the cluster leader broker")
    p = add_command(cmds, "namespaces", _namespaces, "list all namespaces in the cluster")
    add_output(p)
    p = add_command(cmds, "unload", _unload,
                    "unload a broker by migrating all hosted topics off it",
                    "  danube admin brokers unload --broker-id 123 --dry-run\n"
                    "  danube admin brokers unload --broker-id 123 --namespaces-include default")
    p.add_argument("--broker-id", required=True, help="target broker id")
    p.add_argument("--max-parallel", type=u32, default=1,
                   help="max topics to unload in parallel (default 1)")
    p.add_argument("--namespaces-include", action="append", default=[], metavar="NS",
                   help="namespaces to include (repeatable)")
    p.add_argument("--namespaces-exclude", action="append", default=[], metavar="NS",
                   help="namespaces to exclude (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="only list topics to be unloaded")
    p.add_argument("--timeout-seconds", type=u32, default=60,
                   help="per-topic timeout seconds (default 60)")
    p = add_command(cmds, "activate", _activate, "activate a broker (set its state to active)")
    p.add_argument("--broker-id", required=True, help="target broker id")
    p.add_argument("--reason", default="admin_activate",
                   help="reason, for auditability (default admin_activate)")
    p = add_command(cmds, "balance", _balance, "show cluster balance metrics and broker loads")
    add_output(p)
    p = add_command(cmds, "rebalance", _rebalance, "trigger manual cluster rebalancing",
                    "  danube admin brokers rebalance --dry-run\n"
                    "  danube admin brokers rebalance --max-moves 10")
    p.add_argument("--dry-run", action="store_true",
                   help="show proposed moves without executing them")
    p.add_argument("--max-moves", type=u32, help="maximum number of topic moves")


async def _list(admin, args):
    resp = await admin.call("BrokerAdmin", "ListBrokers", what="list brokers")
    if args.output == "json":
        emit_json([{"broker_id": b.broker_id, "broker_status": b.broker_status,
                    "broker_addr": b.broker_addr, "broker_role": b.broker_role,
                    "admin_addr": b.admin_addr, "metrics_addr": b.metrics_addr}
                   for b in resp.brokers])
        return
    table(("BROKER ID", "STATUS", "ADDRESS", "ROLE", "ADMIN ADDR", "METRICS ADDR"),
          [(b.broker_id, b.broker_status, b.broker_addr, b.broker_role, b.admin_addr,
            b.metrics_addr) for b in resp.brokers], (15, 15, 25, 15, 25, 25))


async def _leader(admin, args):
    resp = await admin.call("BrokerAdmin", "GetLeaderBroker", what="get the leader broker")
    print(f'Leader Broker: "{resp.leader}"')     # upstream prints the Rust Debug form


async def _namespaces(admin, args):
    resp = await admin.call("BrokerAdmin", "ListNamespaces", what="list namespaces")
    if args.output == "json":
        emit_json(list(resp.namespaces))
        return
    for namespace in resp.namespaces:
        print(f"Namespace: {namespace}")


async def _unload(admin, args):
    resp = await admin.call("BrokerAdmin", "UnloadBroker", adm.UnloadBrokerRequest(
        broker_id=args.broker_id, max_parallel=args.max_parallel,
        namespaces_include=args.namespaces_include, namespaces_exclude=args.namespaces_exclude,
        dry_run=args.dry_run, timeout_seconds=args.timeout_seconds),
        what=f"unload broker {args.broker_id}")
    print(f"UnloadBroker started={_bool(resp.started)} total={resp.total} "
          f"succeeded={resp.succeeded} failed={resp.failed} pending={resp.pending}")
    if resp.failed_topics:
        print("Failed topics:", file=sys.stderr)
        for topic in resp.failed_topics:
            print(f"  {topic}", file=sys.stderr)


async def _activate(admin, args):
    resp = await admin.call("BrokerAdmin", "ActivateBroker", adm.ActivateBrokerRequest(
        broker_id=args.broker_id, reason=args.reason), what=f"activate broker {args.broker_id}")
    print(f"ActivateBroker success={_bool(resp.success)}")


def _bool(value):
    return "true" if value else "false"


async def _balance(admin, args):
    b = await admin.call("BrokerAdmin", "GetClusterBalance", adm.ClusterBalanceRequest(),
                         what="get cluster balance")
    if args.output == "json":
        emit_json({"coefficient_of_variation": b.coefficient_of_variation,
                   "mean_load": b.mean_load, "max_load": b.max_load, "min_load": b.min_load,
                   "std_deviation": b.std_deviation, "broker_count": b.broker_count,
                   "brokers": [{"broker_id": x.broker_id, "load": x.load,
                                "topic_count": x.topic_count, "is_overloaded": x.is_overloaded,
                                "is_underloaded": x.is_underloaded} for x in b.brokers]})
        return
    cv = b.coefficient_of_variation * 100.0
    status = ("✅ Well Balanced" if cv < 20 else "✅ Balanced" if cv < 30 else
              "⚠️  Imbalanced" if cv < 40 else "❌ Severely Imbalanced")
    _banner("          Cluster Balance Report")
    print(f"Status:                    {status}")
    print(f"Coefficient of Variation:  {cv:.2f}%")
    print(f"Assignment Strategy:       {b.assignment_strategy}")
    print("\nInterpretation Guide:\n  < 20%  = ✅ Well Balanced\n  20-30% = ✅ Balanced\n"
          "  30-40% = ⚠️  Imbalanced\n  > 40%  = ❌ Severely Imbalanced\n")
    print("Load Statistics:")
    print(f"  Mean Load:       {b.mean_load:.2f}")
    print(f"  Max Load:        {b.max_load:.2f}")
    print(f"  Min Load:        {b.min_load:.2f}")
    print(f"  Std Deviation:   {b.std_deviation:.2f}")
    print(f"  Broker Count:    {b.broker_count}\n")
    if b.brokers:
        print("Broker Details:")
        table(("BROKER ID", "LOAD", "TOPICS", "STATUS"),
              [(x.broker_id, f"{x.load:.1f}", x.topic_count,
                "Overloaded" if x.is_overloaded else
                "Underloaded" if x.is_underloaded else "Normal") for x in b.brokers],
              (15, 10, 10, 15))
    if cv >= 30:
        print("\n💡 Recommendation: Run 'danube-admin brokers rebalance' to balance the cluster")


def _banner(title):
    print(f"\n╔{BANNER}╗\n║ {title.ljust(len(BANNER) - 1)}║\n╚{BANNER}╝\n")


async def _rebalance(admin, args):
    request = adm.RebalanceRequest(dry_run=args.dry_run)
    if args.max_moves is not None:
        request.max_moves = args.max_moves
    r = await admin.call("BrokerAdmin", "TriggerRebalance", request, what="rebalance")
    if not r.success:
        print(f"❌ Rebalancing failed: {r.error_message}", file=sys.stderr)
        return 1
    if args.dry_run:
        _banner("        Dry Run - Proposed Rebalancing Moves")
        if not r.proposed_moves:
            print(f"ℹ️  {r.error_message}" if r.error_message else
                  "✅ Cluster is balanced - no moves needed")
            return
        print(f"Would move {len(r.proposed_moves)} topic(s):\n")
        for i, mv in enumerate(r.proposed_moves, 1):
            print(f"  {i}. {mv.topic_name}")
            print(f"     From: Broker {mv.from_broker} → To: Broker {mv.to_broker}")
            print(f"     Estimated load: {mv.estimated_load:.2f}")
            print(f"     Reason: {mv.reason}\n")
        print("💡 Run without --dry-run to execute these moves")
        return
    _banner("        Cluster Rebalancing Triggered")
    if r.moves_executed == 0:
        print(f"ℹ️  {r.error_message}" if r.error_message else
              "✅ Cluster is already balanced - no action needed")
        return
    if "background" in r.error_message:
        print("🔄 Rebalancing Started in Background!\n\n"
              "  The cluster will be rebalanced automatically.\n"
              "  Check broker logs for progress.")
    else:
        print("✅ Rebalancing Complete!")
    print()
    if r.proposed_moves:
        print("First move initiated:")
        for mv in r.proposed_moves:
            print(f"  → {mv.topic_name} (Broker {mv.from_broker} → Broker {mv.to_broker})")
    print("\n💡 Run 'danube-admin brokers balance' to verify cluster state")
