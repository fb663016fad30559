"""The UI API's GET answers (upstream's server/ui/*.rs): each asks the broker's admin API
for what it owns (brokers, topics, subscriptions, schemas) and Prometheus for the counters
and rates, and returns upstream's shape. A failed metrics query is listed in `errors`
with zeros in its fields, as upstream does; a failed admin call that the page cannot do
without is the answer's status (map_error)."""

import asyncio
import time

from danube.client import errors as client_errors
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr

from danube.adminui.http import BadRequest, now, ok
from danube.promql.queries import label

SUB_TYPES = {1: "Shared", 2: "Failover", 3: "KeyShared"}
BACKOFF = {1: "exponential"}
POISON = {0: "dead_letter", 1: "block", 2: "drop"}


async def health(state, request):
    try:
        await state.call("BrokerAdmin", "GetLeaderBroker")
        reachable = True
    except client_errors.DanubeError:
        reachable = False
    return ok({"status": "ok", "leader_reachable": reachable})


def _identity(b):
    return {"broker_id": b.broker_id, "broker_addr": b.broker_addr,
            "broker_role": b.broker_role, "broker_status": b.broker_status}


async def _broker_topics(state, broker_id):
    resp = await state.call("TopicAdmin", "ListBrokerTopics",
                            adm.BrokerRequest(broker_id=broker_id))
    return list(resp.topics)


async def cluster(state, request):
    async def load():
        brokers = (await state.call("BrokerAdmin", "ListBrokers")).brokers
        errors = []

        async def one(b):
            try:
                names = {t.name for t in await _broker_topics(state, b.broker_id)}
            except client_errors.DanubeError as exc:
                errors.append(f"list_broker_topics failed for {b.broker_id}: {exc}")
                names = set()
            stats, errs = await state.queries.broker_connections(b.broker_id, names)
            if errs:
                errors.append(f"metrics scrape failed for {b.broker_id}: {'; '.join(errs)}")
                stats = {"rpc_total": 0, "active_connections": 0}
            return {**_identity(b), "admin_addr": b.admin_addr, "stats": {
                "topics_owned": len(names), "rpc_total": stats["rpc_total"],
                "active_connections": stats["active_connections"], "errors_5xx_total": 0}}
        out = await asyncio.gather(*(one(b) for b in brokers))
        # upstream's field order: broker_id, broker_addr, broker_role, broker_status,
        # admin_addr, stats
        return {"timestamp": now(), "brokers": list(out), "totals": {
            "broker_count": len(out),
            "topics_total": sum(b["stats"]["topics_owned"] for b in out),
            "rpc_total": sum(b["stats"]["rpc_total"] for b in out),
            "active_connections": sum(b["stats"]["active_connections"] for b in out)},
            "errors": errors}
    return ok(await state.cache.get("cluster", load))


async def cluster_balance(state, request):
    try:
        res = await state.call("BrokerAdmin", "GetClusterBalance", adm.ClusterBalanceRequest())
    except client_errors.DanubeError as exc:
        return ok({"error": str(exc)}, 502)
    return ok({
        "coefficient_of_variation": res.coefficient_of_variation, "mean_load": res.mean_load,
        "max_load": res.max_load, "min_load": res.min_load,
        "std_deviation": res.std_deviation, "broker_count": res.broker_count,
        "assignment_strategy": res.assignment_strategy,
        "brokers": [{"broker_id": str(b.broker_id), "load": b.load,
                     "topic_count": b.topic_count, "is_overloaded": b.is_overloaded,
                     "is_underloaded": b.is_underloaded} for b in res.brokers]})


async def raft_status(state, request):
    s = await state.call("ClusterAdmin", "ClusterStatus")
    return ok({"leader_id": str(s.leader_id), "current_term": s.current_term,
               "last_applied": s.last_applied, "voters": [str(v) for v in s.voters],
               "learners": [str(v) for v in s.learners],
               "self_node_id": str(s.self_node_id), "raft_addr": s.raft_addr})


def _topic_mini(info, counts):
    p, c, s = counts.get(info.name, (0, 0, 0))
    return {"name": info.name, "delivery": info.delivery, "producers_connected": p,
            "consumers_connected": c, "subscriptions": s}


async def topics(state, request):
    async def load():
        brokers = (await state.call("BrokerAdmin", "ListBrokers")).brokers
        errors = []

        async def one(b):
            # Upstream lists no topics of a broker whose metrics did not answer; here the
            # admin API's list stands, with zero counts and the error (docs/compatibility).
            counts, errs = await state.queries.topics_by_broker(b.broker_id)
            if errs:
                errors.append(f"topics fetch failed for broker {b.broker_id}: "
                              f"{'; '.join(errs)}")
            try:
                infos = sorted(await _broker_topics(state, b.broker_id), key=lambda t: t.name)
            except client_errors.DanubeError as exc:
                errors.append(f"topics fetch failed for broker {b.broker_id}: {exc}")
                infos = []
            return {"broker": _identity(b), "topics": [_topic_mini(t, counts) for t in infos]}
        return {"timestamp": now(), "brokers": list(await asyncio.gather(*map(one, brokers))),
                "errors": errors}
    return ok(await state.cache.get("topics", load))


async def namespaces(state, request):
    async def load():
        names = sorted(set((await state.call("BrokerAdmin", "ListNamespaces")).namespaces))
        errors = []

        async def one(ns):
            req = adm.NamespaceRequest(name=ns)
            topics_, policies = await asyncio.gather(
                state.call("TopicAdmin", "ListNamespaceTopics", req),
                state.call("NamespaceAdmin", "GetNamespacePolicies", req),
                return_exceptions=True)
            if isinstance(topics_, client_errors.DanubeError):
                errors.append(f"list_topics failed for {ns}: {topics_}")
                topics_ = None
            elif isinstance(topics_, BaseException):
                raise topics_
            if isinstance(policies, client_errors.DanubeError):
                errors.append(f"get_namespace_policies failed for {ns}: {policies}")
                policies = None
            elif isinstance(policies, BaseException):
                raise policies
            return {"name": ns, "topics": [t.name for t in topics_.topics] if topics_ else [],
                    "policies": policies.policies if policies else ""}
        return {"timestamp": now(), "namespaces": list(await asyncio.gather(*map(one, names))),
                "errors": errors}
    return ok(await state.cache.get("namespaces", load))


async def broker(state, request, broker_id):
    async def load():
        brokers = (await state.call("BrokerAdmin", "ListBrokers")).brokers
        found = next((b for b in brokers if b.broker_id == broker_id), None)
        if found is None:
            raise BadRequest(404, "unknown broker")
        errors = []
        try:
            infos = await _broker_topics(state, broker_id)
        except client_errors.DanubeError as exc:
            errors.append(f"list_broker_topics failed: {exc}")
            infos = []
        (figures, errs1), (counts, errs2) = await asyncio.gather(
            state.queries.broker_bytes_and_rpc(broker_id),
            state.queries.topics_by_broker(broker_id))
        if errs1 or errs2:
            errors.append(f"metrics scrape failed: {'; '.join(errs1 + errs2)}")
        return {"timestamp": now(), "broker": _identity(found), "metrics": {
            "rpc_total": figures["rpc_total"], "topics_owned": len(infos),
            "inbound_bytes_total": figures["bytes_in_total"],
            "outbound_bytes_total": figures["bytes_out_total"], "errors_5xx_total": 0},
            "topics": [_topic_mini(t, counts) for t in infos], "errors": errors}
    try:
        return ok(await state.cache.get(("broker", broker_id), load))
    except client_errors.DanubeError as exc:
        # upstream answers 404 for any failure to resolve the broker
        return ok({"error": str(exc)}, 404)


def _failure_policy(fp):
    return {"max_redelivery_count": fp.max_redelivery_count,
            "ack_timeout_ms": fp.ack_timeout_ms,
            "base_redelivery_delay_ms": fp.base_redelivery_delay_ms,
            "max_redelivery_delay_ms": fp.max_redelivery_delay_ms,
            "backoff_strategy": BACKOFF.get(fp.backoff_strategy, "fixed"),
            "dead_letter_topic": fp.dead_letter_topic if fp.HasField("dead_letter_topic")
            else None,
            "poison_policy": POISON.get(fp.poison_policy, "unknown")}


async def _subscription(state, topic, name):
    try:
        res = await state.call("TopicAdmin", "GetSubscriptionFailurePolicy",
                               adm.GetSubscriptionFailurePolicyRequest(topic=topic,
                                                                       subscription=name))
    except client_errors.DanubeError:
        return {"name": name, "subscription_type": "Exclusive", "failure_policy": None}
    return {"name": name, "subscription_type": SUB_TYPES.get(res.subscription_type, "Exclusive"),
            "failure_policy": _failure_policy(res.failure_policy)
            if res.HasField("failure_policy") else None}


def _opt(msg, field):
    return getattr(msg, field) if msg.HasField(field) else None


async def _topic_metrics(state, topic):
    errors = []
    q = state.queries
    core, active, rates, quality, latency, size, reliable = await asyncio.gather(
        q.topic_core(topic, errors), q.topic_active(topic, errors),
        q.topic_rates(topic, errors), q.producer_quality(topic, errors),
        q.latency_summary(topic, errors), q.message_size_avg(topic, errors),
        q.reliable(topic, errors))
    if reliable is not None:
        # Upstream's server sends wal_flush_total and its admin UI (through its latest
        # version) reads wal_fsync_total, showing a blank: both carry the WAL's flush-and-
        # sync passes here (docs/compatibility.md).
        reliable["wal_fsync_total"] = reliable["wal_flush_total"]
    return {
        "core": {"msg_in_total": core["messages_in_total"],
                 "msg_out_total": core["messages_out_total"],
                 "bytes_in_total": core["bytes_in_total"],
                 "bytes_out_total": core["bytes_out_total"]},
        "active": active, "rates": rates, "quality": quality,
        "latency_size": {"send_latency_ms_p50": latency["p50_ms"],
                         "send_latency_ms_p95": latency["p95_ms"],
                         "send_latency_ms_p99": latency["p99_ms"],
                         "msg_size_bytes_avg": size},
        "reliable": reliable}, errors


async def topic(state, request, name):
    async def load():
        desc = await state.call("TopicAdmin", "DescribeTopic",
                                adm.DescribeTopicRequest(name=name))
        subs = await state.call("TopicAdmin", "ListSubscriptions", adm.TopicRequest(name=name))
        seen, names = set(), []
        for s in subs.subscriptions:
            # upstream skips its metadata keys' names and repeats
            if s in ("cursor", "failure_policy") or s in seen:
                continue
            seen.add(s)
            names.append(s)
        (metrics, errors), details = await asyncio.gather(
            _topic_metrics(state, name),
            asyncio.gather(*(_subscription(state, name, s) for s in names)))
        return {"timestamp": now(), "topic": {
            "name": desc.name, "schema_subject": _opt(desc, "schema_subject"),
            "schema_id": _opt(desc, "schema_id"), "schema_version": _opt(desc, "schema_version"),
            "schema_type": _opt(desc, "schema_type"),
            "compatibility_mode": _opt(desc, "compatibility_mode"),
            "subscriptions": list(details)}, "metrics": metrics, "errors": errors}
    return ok(await state.cache.get(("topic", name), load))


_SERIES = (
    ("publish_rate_1m", "sum(rate(danube_topic_messages_in_total{{topic=\"{t}\"}}[1m]))"),
    ("dispatch_rate_1m",
     "sum(rate(danube_consumer_messages_out_total{{topic=\"{t}\"}}[1m]))"),
    ("bytes_in_rate_1m", "sum(rate(danube_topic_bytes_in_total{{topic=\"{t}\"}}[1m]))"),
    ("bytes_out_rate_1m", "sum(rate(danube_consumer_bytes_out_total{{topic=\"{t}\"}}[1m]))"),
)
_ERRORS_BY_CODE = ("sum by (error_code) (rate(danube_producer_send_total"
                   "{{topic=\"{t}\",result=\"error\"}}[5m]))")


def _int_param(params, key):
    text = params.get(key)
    if text is None:
        raise BadRequest(400, f"Failed to deserialize query string: missing field `{key}`")
    try:
        return int(text)
    except ValueError:
        raise BadRequest(400, f"Failed to deserialize query string: {key}: invalid digit "
                              f"found in string") from None


async def topic_series(state, request, name):
    params = request.query_params
    start, end = _int_param(params, "from"), _int_param(params, "to")
    if "step" not in params:
        raise BadRequest(400, "Failed to deserialize query string: missing field `step`")
    step = params["step"] or "15s"
    now_s = int(time.time())
    start = max(now_s - 24 * 3600, min(start, now_s))
    end = max(start + 1, min(end, now_s))
    t = label(name)
    errors, series = [], []
    results = await asyncio.gather(
        *(state.queries.series(q.format(t=t), start, end, step) for _, q in _SERIES),
        state.queries.series(_ERRORS_BY_CODE.format(t=t), start, end, step),
        return_exceptions=True)
    for (key, _), res in zip(_SERIES, results):
        if isinstance(res, Exception):
            errors.append(f"{key} query failed: {res}")
        else:
            series.append({"name": key, "labels": None, "points": res[0][1] if res else []})
    last = results[-1]
    if isinstance(last, Exception):
        errors.append(f"producer_send_errors query failed: {last}")
    else:
        for labels, points in last:
            code = {"error_code": labels["error_code"]} if "error_code" in labels else {}
            series.append({"name": "producer_send_errors", "labels": code, "points": points})
    return ok({"series": series, "errors": errors})


async def schemas(state, request):
    async def load():
        resp = await state.call("SchemaRegistry", "ListSubjects", sr.ListSubjectsRequest())
        subjects = sorted(({"subject": s.subject, "schema_type": s.schema_type,
                            "latest_version": s.latest_version,
                            "compatibility_mode": s.compatibility_mode,
                            "schema_id": s.schema_id, "tags": list(s.tags)}
                           for s in resp.subjects), key=lambda s: s["schema_id"])
        return {"timestamp": now(), "subjects": subjects}
    return ok(await state.cache.get("schemas", load))


async def schema_detail(state, request, subject):
    async def load():
        latest, versions = await asyncio.gather(
            state.call("SchemaRegistry", "GetLatestSchema",
                       sr.GetLatestSchemaRequest(subject=subject)),
            state.call("SchemaRegistry", "ListVersions", sr.ListVersionsRequest(subject=subject)))
        try:
            definition = latest.schema_definition.decode("utf-8")
        except UnicodeDecodeError:
            definition = "binary schema definition"
        return {"timestamp": now(), "subject": subject, "schema_type": latest.schema_type,
                "compatibility_mode": latest.compatibility_mode, "latest": {
                    "schema_id": latest.schema_id, "version": latest.version,
                    "subject": latest.subject, "schema_type": latest.schema_type,
                    "schema_definition": definition, "description": latest.description,
                    "created_at": latest.created_at, "created_by": latest.created_by,
                    "tags": list(latest.tags), "fingerprint": latest.fingerprint,
                    "compatibility_mode": latest.compatibility_mode},
                "versions": [{"version": v.version, "created_at": v.created_at,
                              "created_by": v.created_by, "description": v.description,
                              "fingerprint": v.fingerprint, "schema_id": v.schema_id}
                             for v in versions.versions]}
    return ok(await state.cache.get(("schema", subject), load))


async def roles(state, request):
    res = await state.call("SecurityAdmin", "ListRoles")
    return ok({"roles": [{"name": r.name, "permissions": list(r.permissions),
                          "system": r.system} for r in res.roles]})


async def bindings(state, request):
    res = await state.call("SecurityAdmin", "ListAllBindings")
    return ok({"bindings": [{"id": b.id, "principal_type": b.principal_type,
                             "principal_name": b.principal_name,
                             "role_names": list(b.role_names), "scope": b.scope,
                             "resource_name": b.resource_name} for b in res.bindings]})

