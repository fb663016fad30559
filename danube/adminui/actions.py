"""The UI API's POST actions (upstream's cluster_actions.rs, topic_actions.rs, schemas.rs,
raft.rs, security.rs and cluster.rs's rebalance): a JSON body checked field by field before
any call, one admin call, and upstream's {"success", "message"} answer (502 with the
broker's message when the call fails, 400 for a body the API refuses)."""

import logging
import re

from danube.client import errors as client_errors
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr

from danube.adminui.http import BadRequest, json_body, map_error, ok

log = logging.getLogger("danube.adminui")

OPT_STR, REQ_STR = ((str,), False), ((str,), True)
OPT_INT, OPT_BOOL, OPT_LIST = ((int,), False), ((bool,), False), ((list,), False)
_TOPIC_PART = re.compile(r"^[\w-]*$")


def _result(success, message, status=200):
    return ok({"success": success, "message": message}, status)


def _failed(exc):
    return _result(False, str(exc), 502)


async def cluster_actions(state, request):
    body = await json_body(request, {
        "action": REQ_STR, "broker_id": REQ_STR, "max_parallel": OPT_INT,
        "namespaces_include": OPT_LIST, "namespaces_exclude": OPT_LIST, "dry_run": OPT_BOOL,
        "timeout_seconds": OPT_INT, "reason": OPT_STR})
    broker_id = body["broker_id"]
    if not broker_id.strip():
        return _result(False, "missing broker_id", 400)
    action = body["action"].lower()
    try:
        if action == "unload":
            r = await state.call("BrokerAdmin", "UnloadBroker", adm.UnloadBrokerRequest(
                broker_id=broker_id, max_parallel=_or(body, "max_parallel", 1),
                namespaces_include=body.get("namespaces_include") or [],
                namespaces_exclude=body.get("namespaces_exclude") or [],
                dry_run=_or(body, "dry_run", False),
                timeout_seconds=_or(body, "timeout_seconds", 60)))
            result = (r.started, f"started={_b(r.started)} total={r.total} "
                                 f"succeeded={r.succeeded} failed={r.failed} pending={r.pending}")
        elif action == "activate":
            r = await state.call("BrokerAdmin", "ActivateBroker", adm.ActivateBrokerRequest(
                broker_id=broker_id, reason=_or(body, "reason", "admin_activate")))
            result = (r.success, f"success={_b(r.success)}")
        else:
            return _result(False, "unsupported action", 502)
    except client_errors.DanubeError as exc:
        return _failed(exc)
    state.forget()
    log.info("cluster action %s on broker %s: %s", action, broker_id, result[1])
    return _result(*result)


async def cluster_rebalance(state, request):
    body = await json_body(request, {"dry_run": OPT_BOOL, "max_moves": OPT_INT})
    req = adm.RebalanceRequest(dry_run=_or(body, "dry_run", False))
    if body.get("max_moves") is not None:
        req.max_moves = body["max_moves"]
    try:
        r = await state.call("BrokerAdmin", "TriggerRebalance", req)
    except client_errors.DanubeError as exc:
        return ok({"success": False, "moves_executed": 0, "proposed_moves": [],
                   "error_message": str(exc)}, 502)
    state.forget()
    return ok({"success": r.success, "moves_executed": r.moves_executed,
               "proposed_moves": [{"topic_name": m.topic_name, "from_broker": str(m.from_broker),
                                   "to_broker": str(m.to_broker),
                                   "estimated_load": m.estimated_load, "reason": m.reason}
                                  for m in r.proposed_moves],
               "error_message": r.error_message})


async def raft_actions(state, request):
    body = await json_body(request, {"action": REQ_STR, "node_id": REQ_STR})
    text = body["node_id"]
    if not text.isdigit() or int(text) >= 2 ** 64:
        return _result(False, "Invalid node_id format", 400)
    node_id, action = int(text), body["action"].lower()
    try:
        if action == "promote_node":
            r = await state.call("ClusterAdmin", "PromoteNode",
                                 adm.PromoteNodeRequest(node_id=node_id))
        elif action == "remove_node":
            r = await state.call("ClusterAdmin", "RemoveNode",
                                 adm.RemoveNodeRequest(node_id=node_id))
        else:
            return _result(False, "Unsupported raft action", 502)
    except client_errors.DanubeError as exc:
        return _failed(exc)
    return _result(r.success, r.message)


def normalize_topic(text, namespace=None):
    """upstream's normalize_topic: /ns/topic as given, ns/topic with a slash added, a bare
    name in `namespace`; each part letters, digits, _ or -."""
    s = text.strip()
    if s.startswith("/"):
        parts = s.split("/")
        if len(parts) == 3 and all(_TOPIC_PART.match(p) for p in parts):
            return s
        raise BadRequest(400, "wrong topic format, should be /namespace/topic")
    parts = s.split("/")
    if len(parts) == 2:
        return "/" + s
    if len(parts) == 1:
        if namespace is None:
            raise BadRequest(400, "missing namespace for topic without namespace")
        return f"/{namespace}/{s}"
    raise BadRequest(400, "wrong topic format, should be /namespace/topic")


def _reliable(text):
    return (text or "non_reliable").lower() in ("reliable", "reliable_dispatch",
                                                "reliable-dispatch")


async def topic_actions(state, request):
    body = await json_body(request, {
        "action": REQ_STR, "topic": REQ_STR, "namespace": OPT_STR, "partitions": OPT_INT,
        "schema_type": OPT_STR, "schema_data": OPT_STR, "schema_subject": OPT_STR,
        "dispatch_strategy": OPT_STR})
    try:
        name = normalize_topic(body["topic"], body.get("namespace"))
    except BadRequest as exc:
        return _result(False, str(exc), 400)
    action = body["action"].lower()
    try:
        if action == "create":
            r = await _create(state, name, body)
        elif action == "delete":
            r = await state.call("TopicAdmin", "DeleteTopic", adm.TopicRequest(name=name))
        elif action == "unload":
            r = await state.call("TopicAdmin", "UnloadTopic", adm.TopicRequest(name=name))
        else:
            return _result(False, "unsupported action", 502)
    except client_errors.DanubeError as exc:
        return _failed(exc)
    state.forget()
    log.info("topic action %s on %s: success=%s", action, name, r.success)
    return _result(r.success, "ok" if r.success else "not_ok")


async def _create(state, name, body):
    """upstream's create: a schema_subject when given. Upstream's UI sends instead
    schema_type (String, Bytes, Int64, Json) with schema_data ("{}" by default), which
    upstream's server passes on as the subject whenever schema_data is not empty; here that
    name is the topic's subject only when the registry has a subject of that name, so the
    UI's create works on a registry without one (docs/compatibility)."""
    subject = body.get("schema_subject")
    if subject is None and body.get("schema_data") and body.get("schema_type", "String"):
        subject = await _registered(state, body.get("schema_type", "String"))
    strategy = adm.Reliable if _reliable(body.get("dispatch_strategy")) else adm.NonReliable
    if body.get("partitions") is not None:
        req = adm.PartitionedTopicRequest(base_name=name, partitions=body["partitions"],
                                          dispatch_strategy=strategy)
        method = "CreatePartitionedTopic"
    else:
        req = adm.NewTopicRequest(name=name, dispatch_strategy=strategy)
        method = "CreateTopic"
    if subject:
        req.schema_subject = subject
    return await state.call("TopicAdmin", method, req)


async def _registered(state, subject):
    """`subject` when the registry has it, else None."""
    try:
        await state.call("SchemaRegistry", "GetLatestSchema",
                         sr.GetLatestSchemaRequest(subject=subject))
    except client_errors.NotFound:
        return None
    return subject


async def schema_actions(state, request):
    body = await json_body(request, {"action": REQ_STR, "subject": REQ_STR,
                                     "compatibility_mode": OPT_STR, "version": OPT_INT})
    action, subject = body["action"].lower(), body["subject"]
    try:
        if action == "set_compatibility":
            if body.get("compatibility_mode") is None:
                return _result(False, "Missing compatibility_mode for set_compatibility "
                                      "action", 400)
            r = await state.call("SchemaRegistry", "SetCompatibilityMode",
                                 sr.SetCompatibilityModeRequest(
                                     subject=subject,
                                     compatibility_mode=body["compatibility_mode"]))
        elif action == "delete_version":
            if body.get("version") is None:
                return _result(False, "Missing version for delete_version action", 400)
            r = await state.call("SchemaRegistry", "DeleteSchemaVersion",
                                 sr.DeleteSchemaVersionRequest(subject=subject,
                                                               version=body["version"]))
        else:
            return _result(False, f"Unsupported action: {action}")
    except client_errors.DanubeError as exc:
        # upstream answers a failed schema action with 200 and success false
        return _result(False, str(exc))
    if r.success:
        state.forget("schemas", ("schema", subject))
    return _result(r.success, "ok" if r.success else "not_ok")


async def role_actions(state, request):
    body = await json_body(request, {"action": REQ_STR, "name": REQ_STR,
                                     "permissions": OPT_LIST})
    if body["action"] == "create":
        req = adm.CreateRoleRequest(role=adm.RoleDefinition(
            name=body["name"], permissions=body.get("permissions") or [], system=False))
        call = ("CreateRole", req)
    elif body["action"] == "delete":
        call = ("DeleteRole", adm.DeleteRoleRequest(name=body["name"]))
    else:
        return ok({"error": "invalid action"}, 400)
    try:
        await state.call("SecurityAdmin", *call)
    except client_errors.DanubeError as exc:
        return map_error(exc)
    return ok({"success": True})


async def binding_actions(state, request):
    body = await json_body(request, {
        "action": REQ_STR, "id": REQ_STR, "principal_type": OPT_STR,
        "principal_name": OPT_STR, "roles": OPT_LIST, "scope": REQ_STR, "resource": OPT_STR})
    if body["action"] == "create":
        req = adm.CreateBindingRequest(binding=adm.BindingDefinition(
            id=body["id"], principal_type=body.get("principal_type") or "",
            principal_name=body.get("principal_name") or "",
            role_names=body.get("roles") or [], scope=body["scope"],
            resource_name=body.get("resource") or ""))
        call = ("CreateBinding", req)
    elif body["action"] == "delete":
        call = ("DeleteBinding", adm.DeleteBindingRequest(
            binding_id=body["id"], scope=body["scope"], resource_name=body.get("resource") or ""))
    else:
        return ok({"error": "invalid action"}, 400)
    try:
        await state.call("SecurityAdmin", *call)
    except client_errors.DanubeError as exc:
        return map_error(exc)
    return ok({"success": True})


def _or(body, key, default):
    value = body.get(key)
    return default if value is None else value


def _b(flag):
    return "true" if flag else "false"
