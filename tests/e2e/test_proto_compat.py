"""Wire compatibility of protocol/*.proto with Danube v0.15.1.

* DanubeApi.proto and SchemaRegistry.proto are compared with the descriptors shipped in the
  official Python client (`danube-client`, import name `danube`). Because that import name
  clashes with ours, the official descriptors are dumped by tests/support/_official_dump.py running
  under a separate interpreter (env var DANUBE_OFFICIAL_PYTHON, default
  <repo>/.venv-official/bin/python) and compared here field by field.
* DanubeAdmin.proto is not shipped by any official client; it is checked against a table
  transcribed from the v0.15.1 interface reference (section a.3).
* The generated danube/proto/*_pb2.py modules must be up to date with protocol/*.proto.
"""

import base64
import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_SRC = os.path.join(REPO, "protocol")
DUMP_SCRIPT = os.path.join(REPO, "tests", "support", "_official_dump.py")
OFFICIAL_PYTHON = os.environ.get(
    "DANUBE_OFFICIAL_PYTHON", os.path.join(REPO, ".venv-official", "bin", "python"))

# proto file name -> (our generated module, expected package)
OUR_MODULES = {
    "DanubeApi.proto": ("danube.proto.DanubeApi_pb2", "danube"),
    "SchemaRegistry.proto": ("danube.proto.SchemaRegistry_pb2", "danube_schema"),
    "DanubeAdmin.proto": ("danube.proto.DanubeAdmin_pb2", "danube_admin"),
}

# Things Danube v0.15.1 has that the official Python client (danube-client 0.5.0) predates.
# Each entry names an entity (and, implicitly, everything inside it); ours may have these and
# nothing else beyond what the official descriptors have. Source: interface reference a.1/a.2.
V0_15_1_EXTRAS = {
    "DanubeApi.proto": {
        # a.1 "Service StorageService (v0.15.1; used by the danube-iceberg sidecar)"
        ("service", "danube.StorageService"),
        ("message", "danube.ListSegmentDescriptorsRequest"),
        ("message", "danube.ListSegmentDescriptorsResponse"),
        ("message", "danube.SegmentDescriptorProto"),
    },
    "SchemaRegistry.proto": {
        # a.2 service table: ListSubjects
        ("method", "danube_schema.SchemaRegistry.ListSubjects"),
        ("message", "danube_schema.ListSubjectsRequest"),
        ("message", "danube_schema.SubjectSummary"),
        ("message", "danube_schema.ListSubjectsResponse"),
    },
}


# --------------------------------------------------------------------------------------------
# Descriptor flattening and comparison
# --------------------------------------------------------------------------------------------

def _opt(msg, field):
    """A proto2-style optional scalar of a descriptor proto: its value if set, else None."""
    return getattr(msg, field) if msg.HasField(field) else None


def _options(msg):
    return msg.options.SerializeToString(deterministic=True) if msg.HasField("options") else None


def flatten_file(fdp):
    """Flatten a FileDescriptorProto into {(kind, full name): {attribute: value}}.

    Kinds: file, message, field, oneof, enum, enum_value, service, method. Full names are
    dotted and package-qualified; fields, oneofs and enum values hang under their parent.
    """
    out = {}
    pkg = fdp.package
    out[("file", fdp.name)] = {
        "package": fdp.package,
        "syntax": fdp.syntax,
        "dependency": list(fdp.dependency),
        "options": _options(fdp),
    }

    def add_enum(enum, scope):
        name = f"{scope}.{enum.name}"
        out[("enum", name)] = {
            "options": _options(enum),
            "reserved_range": [(r.start, r.end) for r in enum.reserved_range],
            "reserved_name": list(enum.reserved_name),
        }
        for value in enum.value:
            out[("enum_value", f"{name}.{value.name}")] = {
                "number": value.number, "options": _options(value)}

    def add_message(msg, scope):
        name = f"{scope}.{msg.name}"
        oneofs = [o.name for o in msg.oneof_decl]
        out[("message", name)] = {
            "options": _options(msg),
            "reserved_range": [(r.start, r.end) for r in msg.reserved_range],
            "reserved_name": list(msg.reserved_name),
            "extension_range": [(r.start, r.end) for r in msg.extension_range],
        }
        for i, oneof in enumerate(msg.oneof_decl):
            out[("oneof", f"{name}.{oneof.name}")] = {"index": i, "options": _options(oneof)}
        for field in msg.field:
            oneof_index = _opt(field, "oneof_index")
            out[("field", f"{name}.{field.name}")] = {
                "number": field.number,
                "label": descriptor_pb2.FieldDescriptorProto.Label.Name(field.label),
                "type": descriptor_pb2.FieldDescriptorProto.Type.Name(field.type),
                "type_name": field.type_name,
                "oneof_index": oneof_index,
                "oneof": oneofs[oneof_index] if oneof_index is not None else None,
                "proto3_optional": field.proto3_optional,
                "json_name": _opt(field, "json_name"),
                "default_value": _opt(field, "default_value"),
                "extendee": _opt(field, "extendee"),
                "options": _options(field),
            }
        for nested in msg.nested_type:
            add_message(nested, name)
        for enum in msg.enum_type:
            add_enum(enum, name)

    for msg in fdp.message_type:
        add_message(msg, pkg)
    for enum in fdp.enum_type:
        add_enum(enum, pkg)
    for svc in fdp.service:
        name = f"{pkg}.{svc.name}"
        out[("service", name)] = {"options": _options(svc)}
        for method in svc.method:
            out[("method", f"{name}.{method.name}")] = {
                "input_type": method.input_type,
                "output_type": method.output_type,
                "client_streaming": method.client_streaming,
                "server_streaming": method.server_streaming,
                "options": _options(method),
            }
    return out


def _allowed_extra(key, allowed):
    """True if `key` or one of its enclosing entities is listed in `allowed`."""
    _, name = key
    allowed_names = {n for _, n in allowed}
    if key in allowed:
        return True
    parts = name.split(".")
    return any(".".join(parts[:i]) in allowed_names for i in range(1, len(parts)))


def compare_descriptors(official, ours, allowed_extras=(), labels=("official", "ours")):
    """Compare two FileDescriptorProtos; return a list of human-readable mismatches.

    Everything in `official` must be in `ours` with identical attributes. Entities only in
    `ours` are mismatches too, unless they (or an enclosing entity) are in `allowed_extras`.
    `labels` name the two sides in the messages.
    """
    them, us = labels
    theirs_flat, ours_flat = flatten_file(official), flatten_file(ours)
    problems = []
    for key in sorted(theirs_flat):
        kind, name = key
        if key not in ours_flat:
            problems.append(f"{kind} {name}: missing from {us} ({them} has {theirs_flat[key]})")
            continue
        for attr, want in theirs_flat[key].items():
            got = ours_flat[key].get(attr)
            if got != want:
                problems.append(f"{kind} {name}: {attr}: {them}={want!r} {us}={got!r}")
    for key in sorted(set(ours_flat) - set(theirs_flat)):
        if not _allowed_extra(key, allowed_extras):
            kind, name = key
            problems.append(f"{kind} {name}: only in {us} (not in {them}, nor a known "
                            f"v0.15.1 addition): {ours_flat[key]}")
    return problems


# --------------------------------------------------------------------------------------------
# Loading descriptors
# --------------------------------------------------------------------------------------------

def our_file_descriptor(proto_name):
    module_name, _ = OUR_MODULES[proto_name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        pytest.fail(f"cannot import generated {module_name} ({exc}); generate it with "
                    "`python setup.py build_py` (or `pip install -e .`)")
    return descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)


@pytest.fixture(scope="module")
def official_dump():
    # A missing interpreter fails rather than skips: bin/test always creates it.
    if not os.path.exists(OFFICIAL_PYTHON):
        pytest.fail(
            f"official client interpreter {OFFICIAL_PYTHON} not found: run `bash bin/test`, "
            "or create it with `python3 -m venv .venv-official && .venv-official/bin/pip "
            "install danube-client==0.5.0` (or point DANUBE_OFFICIAL_PYTHON at a python that "
            "has danube-client installed)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # -I: isolated mode, so our own `danube` package can never shadow the official one.
    proc = subprocess.run([OFFICIAL_PYTHON, "-I", DUMP_SCRIPT], capture_output=True,
                          text=True, env=env, cwd=os.path.dirname(DUMP_SCRIPT), timeout=120)
    assert proc.returncode == 0, (
        f"{OFFICIAL_PYTHON} {DUMP_SCRIPT} failed (rc={proc.returncode}); is danube-client "
        f"installed there?\n{proc.stderr}")
    dump = json.loads(proc.stdout)
    for info in dump["files"].values():
        # The official venv may live inside the repo (.venv-official/): only our source
        # package directory is off limits.
        assert not os.path.abspath(info["path"]).startswith(os.path.join(REPO, "danube") + os.sep), (
            f"official dump imported our own package ({info['path']}), not danube-client")
    return dump


def official_file_descriptor(dump, proto_name):
    info = dump["files"].get(proto_name)
    assert info is not None, f"official client has no {proto_name}: {sorted(dump['files'])}"
    return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(info["serialized_pb"]))


# --------------------------------------------------------------------------------------------
# DanubeApi.proto and SchemaRegistry.proto against the official client
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("proto_name", ["DanubeApi.proto", "SchemaRegistry.proto"])
def test_matches_official_client(official_dump, proto_name):
    official = official_file_descriptor(official_dump, proto_name)
    ours = our_file_descriptor(proto_name)
    expected_package = OUR_MODULES[proto_name][1]
    assert official.package == expected_package
    assert ours.package == expected_package
    problems = compare_descriptors(official, ours, V0_15_1_EXTRAS.get(proto_name, set()))
    assert not problems, (
        f"{proto_name} differs from danube-client {official_dump['client_version']} "
        f"({len(problems)} mismatches):\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------------------------
# DanubeAdmin.proto against the interface reference (section a.3), transcribed below
# --------------------------------------------------------------------------------------------

ADMIN_ENUMS_REF = """
DispatchStrategy: NonReliable = 0, Reliable = 1
SubscriptionBackoffStrategy: Fixed = 0, Exponential = 1
SubscriptionPoisonPolicy: DeadLetter = 0, Block = 1, Drop = 2
"""

ADMIN_SERVICES_REF = """
BrokerAdmin
  ListBrokers | Empty -> BrokerListResponse
  GetLeaderBroker | Empty -> BrokerResponse
  ListNamespaces | Empty -> NamespaceListResponse
  UnloadBroker | UnloadBrokerRequest -> UnloadBrokerResponse
  ActivateBroker | ActivateBrokerRequest -> ActivateBrokerResponse
  GetClusterBalance | ClusterBalanceRequest -> ClusterBalanceResponse
  TriggerRebalance | RebalanceRequest -> RebalanceResponse
ClusterAdmin
  ClusterStatus | Empty -> ClusterStatusResponse
  AddNode | AddNodeRequest -> AddNodeResponse
  PromoteNode | PromoteNodeRequest -> PromoteNodeResponse
  RemoveNode | RemoveNodeRequest -> RemoveNodeResponse
NamespaceAdmin
  GetNamespaceTopics | NamespaceRequest -> TopicListResponse
  GetNamespacePolicies | NamespaceRequest -> PolicyResponse
  CreateNamespace | NamespaceRequest -> NamespaceResponse
  DeleteNamespace | NamespaceRequest -> NamespaceResponse
TopicAdmin
  ListNamespaceTopics | NamespaceRequest -> TopicInfoListResponse
  ListBrokerTopics | BrokerRequest -> TopicInfoListResponse
  CreateTopic | NewTopicRequest -> TopicResponse
  CreatePartitionedTopic | PartitionedTopicRequest -> TopicResponse
  DeleteTopic | TopicRequest -> TopicResponse
  UnloadTopic | TopicRequest -> TopicResponse
  ListSubscriptions | TopicRequest -> SubscriptionListResponse
  Unsubscribe | SubscriptionRequest -> SubscriptionResponse
  SetSubscriptionFailurePolicy | SetSubscriptionFailurePolicyRequest -> SubscriptionResponse
  GetSubscriptionFailurePolicy | GetSubscriptionFailurePolicyRequest -> GetSubscriptionFailurePolicyResponse
  DescribeTopic | DescribeTopicRequest -> DescribeTopicResponse
  SetSubscriptionDispatchConfig | SetSubscriptionDispatchConfigRequest -> SubscriptionResponse
  GetSubscriptionDispatchConfig | GetSubscriptionDispatchConfigRequest -> GetSubscriptionDispatchConfigResponse
SecurityAdmin
  CreateRole | CreateRoleRequest -> CreateRoleResponse
  GetRole | GetRoleRequest -> GetRoleResponse
  ListRoles | Empty -> ListRolesResponse
  DeleteRole | DeleteRoleRequest -> DeleteRoleResponse
  CreateBinding | CreateBindingRequest -> CreateBindingResponse
  GetBinding | GetBindingRequest -> GetBindingResponse
  ListBindings | ListBindingsRequest -> ListBindingsResponse
  ListAllBindings | Empty -> ListBindingsResponse
  DeleteBinding | DeleteBindingRequest -> DeleteBindingResponse
"""

# "field number: name type", with the reference's legend: u64, u32, i32, str, double, bool;
# `opt` = proto3 optional, `rep` = repeated; any other type is a danube_admin message/enum.
ADMIN_MESSAGES_REF = """
Empty: {}
RoleDefinition: 1 name str; 2 permissions rep str; 3 system bool
CreateRoleRequest: 1 role RoleDefinition
CreateRoleResponse: 1 success bool
GetRoleRequest: 1 name str
GetRoleResponse: 1 role RoleDefinition
ListRolesResponse: 1 roles rep RoleDefinition
DeleteRoleRequest: 1 name str
DeleteRoleResponse: 1 success bool
BindingDefinition: 1 id str; 2 principal_type str; 3 principal_name str; 4 role_names rep str; 5 scope str; 6 resource_name str
CreateBindingRequest: 1 binding BindingDefinition
CreateBindingResponse: 1 success bool
GetBindingRequest: 1 scope str; 2 resource_name str; 3 binding_id str
GetBindingResponse: 1 binding BindingDefinition
ListBindingsRequest: 1 scope str; 2 resource_name str
ListBindingsResponse: 1 bindings rep BindingDefinition
DeleteBindingRequest: 1 scope str; 2 resource_name str; 3 binding_id str
DeleteBindingResponse: 1 success bool
NamespaceRequest: 1 name str
NamespaceResponse: 1 success bool
NewTopicRequest: 1 name str; 2 schema_subject opt str; 3 dispatch_strategy DispatchStrategy
TopicRequest: 1 name str
TopicResponse: 1 success bool
PartitionedTopicRequest: 1 base_name str; 2 partitions u32; 3 schema_subject opt str; 4 dispatch_strategy DispatchStrategy
SubscriptionRequest: 1 topic str; 2 subscription str
SubscriptionResponse: 1 success bool
SubscriptionFailurePolicy: 1 max_redelivery_count u32; 2 ack_timeout_ms u64; 3 base_redelivery_delay_ms u64; 4 max_redelivery_delay_ms u64; 5 backoff_strategy SubscriptionBackoffStrategy; 6 dead_letter_topic opt str; 7 poison_policy SubscriptionPoisonPolicy
SetSubscriptionFailurePolicyRequest: 1 topic str; 2 subscription str; 3 failure_policy SubscriptionFailurePolicy
GetSubscriptionFailurePolicyRequest: 1 topic str; 2 subscription str
GetSubscriptionFailurePolicyResponse: 1 failure_policy opt SubscriptionFailurePolicy; 2 subscription_type i32
SubscriptionDispatchConfig: 1 max_unacked_messages u32
SetSubscriptionDispatchConfigRequest: 1 topic str; 2 subscription str; 3 dispatch_config SubscriptionDispatchConfig
GetSubscriptionDispatchConfigRequest: 1 topic str; 2 subscription str
GetSubscriptionDispatchConfigResponse: 1 dispatch_config opt SubscriptionDispatchConfig
BrokerListResponse: 1 brokers rep BrokerInfo
BrokerInfo: 1 broker_id str; 2 broker_addr str; 3 broker_role str; 4 admin_addr str; 5 metrics_addr str; 6 broker_status str
BrokerResponse: 1 leader str
NamespaceListResponse: 1 namespaces rep str
TopicListResponse: 1 topics rep str
TopicInfo: 1 name str; 2 broker_id str; 3 delivery str
TopicInfoListResponse: 1 topics rep TopicInfo
BrokerRequest: 1 broker_id str
PolicyResponse: 1 policies str
SubscriptionListResponse: 1 subscriptions rep str
DescribeTopicRequest: 1 name str
DescribeTopicResponse: 1 name str; 2 subscriptions rep str; 3 broker_id str; 4 delivery str; 5 schema_subject opt str; 6 schema_id opt u64; 7 schema_version opt u32; 8 schema_type opt str; 9 compatibility_mode opt str
UnloadBrokerRequest: 1 broker_id str; 2 max_parallel u32; 3 namespaces_include rep str; 4 namespaces_exclude rep str; 5 dry_run bool; 6 timeout_seconds u32
UnloadBrokerResponse: 1 started bool; 2 total u32; 3 succeeded u32; 4 failed u32; 5 pending u32; 6 failed_topics rep str
ActivateBrokerRequest: 1 broker_id str; 2 reason str
ActivateBrokerResponse: 1 success bool
ClusterBalanceRequest: {}
ClusterBalanceResponse: 1 coefficient_of_variation double; 2 mean_load double; 3 max_load double; 4 min_load double; 5 std_deviation double; 6 broker_count u32; 7 brokers rep BrokerLoadInfo; 8 assignment_strategy str
BrokerLoadInfo: 1 broker_id u64; 2 load double; 3 topic_count u32; 4 is_overloaded bool; 5 is_underloaded bool
RebalanceRequest: 1 dry_run bool; 2 max_moves opt u32
RebalanceResponse: 1 success bool; 2 moves_executed u32; 3 proposed_moves rep ProposedMove; 4 error_message str
ProposedMove: 1 topic_name str; 2 from_broker u64; 3 to_broker u64; 4 estimated_load double; 5 reason str
ClusterStatusResponse: 1 leader_id u64; 2 current_term u64; 3 last_applied u64; 4 voters rep u64; 5 learners rep u64; 6 self_node_id u64; 7 raft_addr str
AddNodeRequest: 1 addr str; 2 node_id u64
AddNodeResponse: 1 success bool; 2 node_id u64; 3 message str
PromoteNodeRequest: 1 node_id u64
PromoteNodeResponse: 1 success bool; 2 message str
RemoveNodeRequest: 1 node_id u64
RemoveNodeResponse: 1 success bool; 2 message str
"""

_SCALARS = {"u64": "TYPE_UINT64", "u32": "TYPE_UINT32", "i32": "TYPE_INT32",
            "str": "TYPE_STRING", "bool": "TYPE_BOOL", "double": "TYPE_DOUBLE",
            "bytes": "TYPE_BYTES"}


def parse_reference_tables(pkg, messages_ref, enums_ref="", services_ref=""):
    """Parse tables transcribed from the reference into the flattened form of flatten_file().

    Attribute dicts list only what the reference pins down; None means "must exist".
    """
    enums = {}
    for line in filter(None, map(str.strip, enums_ref.splitlines())):
        name, values = line.split(":")
        enums[name.strip()] = {v.split("=")[0].strip(): int(v.split("=")[1])
                               for v in values.split(",")}
    services, current = {}, None
    for line in filter(str.strip, services_ref.splitlines()):
        if not line.startswith(" "):
            current = services.setdefault(line.strip(), {})
            continue
        method, sig = (s.strip() for s in line.split("|"))
        req, resp = (s.strip() for s in sig.split("->"))
        current[method] = (req, resp)
    messages = {}
    for line in filter(None, map(str.strip, messages_ref.splitlines())):
        name, body = (s.strip() for s in line.split(":", 1))
        fields = {}
        if body != "{}":
            for spec in body.split(";"):
                m = re.fullmatch(r"(\d+) (\w+) (?:(opt|rep) )?(\w+)", spec.strip())
                assert m, f"bad reference spec {spec!r} in {name}"
                number, fname, modifier, ftype = m.groups()
                fields[fname] = (int(number), modifier, ftype)
        messages[name] = fields

    expected = {}
    for ename, values in enums.items():
        expected[("enum", f"{pkg}.{ename}")] = None
        for vname, number in values.items():
            expected[("enum_value", f"{pkg}.{ename}.{vname}")] = {"number": number}
    for sname, methods in services.items():
        expected[("service", f"{pkg}.{sname}")] = None
        for mname, (req, resp) in methods.items():
            expected[("method", f"{pkg}.{sname}.{mname}")] = {
                "input_type": f".{pkg}.{req}", "output_type": f".{pkg}.{resp}",
                "client_streaming": False, "server_streaming": False}
    for mname, fields in messages.items():
        expected[("message", f"{pkg}.{mname}")] = None
        for fname, (number, modifier, ftype) in fields.items():
            if ftype in _SCALARS:
                type_, type_name = _SCALARS[ftype], ""
            else:
                kind = "TYPE_ENUM" if ftype in enums else "TYPE_MESSAGE"
                assert kind == "TYPE_ENUM" or ftype in messages, f"unknown type {ftype}"
                type_, type_name = kind, f".{pkg}.{ftype}"
            expected[("field", f"{pkg}.{mname}.{fname}")] = {
                "number": number,
                "label": "LABEL_REPEATED" if modifier == "rep" else "LABEL_OPTIONAL",
                "type": type_,
                "type_name": type_name,
                "proto3_optional": modifier == "opt",
                "oneof": f"_{fname}" if modifier == "opt" else None,
            }
            if modifier == "opt":
                expected[("oneof", f"{pkg}.{mname}._{fname}")] = None
    return expected


def compare_to_reference(flat, expected, scope=None):
    """Mismatches between flattened descriptors and parsed reference tables.

    Entities in `flat` that the reference does not list are mismatches too; with `scope`
    (a set of (kind, name) keys), only entities inside those keys are considered.
    """
    problems = []
    for key, attrs in sorted(expected.items()):
        if key not in flat:
            problems.append(f"{key[0]} {key[1]}: missing from ours")
            continue
        for attr, want in (attrs or {}).items():
            if flat[key].get(attr) != want:
                problems.append(f"{key[0]} {key[1]}: {attr}: reference={want!r} "
                                f"ours={flat[key].get(attr)!r}")
    for key in sorted(set(flat) - set(expected)):
        if key[0] == "file" or (scope is not None and not _allowed_extra(key, scope)):
            continue
        problems.append(f"{key[0]} {key[1]}: only in ours, not in the reference")
    for key, attrs in sorted(flat.items()):
        if key[0] != "file" and attrs.get("options") is not None and (
                scope is None or _allowed_extra(key, scope)):
            problems.append(f"{key[0]} {key[1]}: unexpected options")
    return problems


def test_admin_matches_reference():
    ours = our_file_descriptor("DanubeAdmin.proto")
    assert ours.package == "danube_admin"
    assert ours.syntax == "proto3"
    # Its own Empty, not google.protobuf.Empty: no imports at all.
    assert list(ours.dependency) == []
    flat = flatten_file(ours)
    expected = parse_reference_tables("danube_admin", ADMIN_MESSAGES_REF, ADMIN_ENUMS_REF,
                                      ADMIN_SERVICES_REF)
    problems = compare_to_reference(flat, expected)
    assert not problems, (f"DanubeAdmin.proto differs from reference a.3 "
                          f"({len(problems)} mismatches):\n  " + "\n  ".join(problems))

    # The tricky spots, spelled out.
    assert flat[("field", "danube_admin.BrokerLoadInfo.broker_id")]["type"] == "TYPE_UINT64"
    assert flat[("field", "danube_admin.BrokerInfo.broker_id")]["type"] == "TYPE_STRING"
    policy = flat[("field", "danube_admin.GetSubscriptionFailurePolicyResponse.failure_policy")]
    assert policy["proto3_optional"] is True
    assert policy["type_name"] == ".danube_admin.SubscriptionFailurePolicy"
    assert flat[("field", "danube_admin.GetSubscriptionFailurePolicyResponse.subscription_type")][
        "type"] == "TYPE_INT32"
    assert flat[("method", "danube_admin.SecurityAdmin.ListAllBindings")]["input_type"] == \
        ".danube_admin.Empty"
    poison = next(e for e in ours.enum_type if e.name == "SubscriptionPoisonPolicy")
    assert [(v.name, v.number) for v in poison.value] == [
        ("DeadLetter", 0), ("Block", 1), ("Drop", 2)]


# --------------------------------------------------------------------------------------------
# The v0.15.1 additions the official client lacks, against the reference (a.1, a.2)
# --------------------------------------------------------------------------------------------

# proto file -> (package, messages table, services table), transcribed from the reference.
V0_15_1_EXTRAS_REF = {
    "DanubeApi.proto": ("danube", """
ListSegmentDescriptorsRequest: 1 topic str; 2 after_offset u64
ListSegmentDescriptorsResponse: 1 segments rep SegmentDescriptorProto
SegmentDescriptorProto: 1 segment_id str; 2 start_offset u64; 3 end_offset u64; 4 size u64; 5 etag str; 6 created_at u64
""", """
StorageService
  ListSegmentDescriptors | ListSegmentDescriptorsRequest -> ListSegmentDescriptorsResponse
"""),
    "SchemaRegistry.proto": ("danube_schema", """
ListSubjectsRequest: {}
SubjectSummary: 1 subject str; 2 schema_type str; 3 latest_version u32; 4 compatibility_mode str; 5 schema_id u64; 6 tags rep str
ListSubjectsResponse: 1 subjects rep SubjectSummary
""", """
SchemaRegistry
  ListSubjects | ListSubjectsRequest -> ListSubjectsResponse
"""),
}


@pytest.mark.parametrize("proto_name", sorted(V0_15_1_EXTRAS))
def test_v0_15_1_additions_match_reference(proto_name):
    """What the official client predates (allowed as extras above) is exactly per reference."""
    pkg, messages_ref, services_ref = V0_15_1_EXTRAS_REF[proto_name]
    expected = parse_reference_tables(pkg, messages_ref, services_ref=services_ref)
    allowlist = V0_15_1_EXTRAS[proto_name]
    assert allowlist <= set(expected), (
        f"allowlist entries without a reference table: {sorted(allowlist - set(expected))}")
    flat = flatten_file(our_file_descriptor(proto_name))
    problems = compare_to_reference(flat, expected, scope=allowlist)
    assert not problems, (f"{proto_name}: v0.15.1 additions differ from the reference "
                          f"({len(problems)} mismatches):\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------------------------
# The generated modules are up to date with protocol/*.proto
# --------------------------------------------------------------------------------------------

def _strip_json_names(fdp):
    """protoc's descriptor sets carry json_name; the descriptors embedded in *_pb2.py do not."""
    def walk(msg):
        for field in msg.field:
            field.ClearField("json_name")
        for nested in msg.nested_type:
            walk(nested)
    for msg in fdp.message_type:
        walk(msg)
    return fdp


def test_generated_modules_up_to_date(tmp_path):
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        pytest.fail(f"grpc_tools is not installed ({exc}): run `bash bin/test` (the test "
                    "extras, `pip install .[test]`, have grpcio-tools)", pytrace=False)
    out = tmp_path / "set.pb"
    protos = sorted(os.path.join(PROTO_SRC, p) for p in OUR_MODULES)
    rc = protoc.main(["protoc", f"-I{PROTO_SRC}", f"--descriptor_set_out={out}", *protos])
    assert rc == 0, "protoc failed on protocol/*.proto"
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert sorted(f.name for f in compiled.file) == sorted(OUR_MODULES)
    for fresh in compiled.file:
        fresh = _strip_json_names(fresh)
        generated = our_file_descriptor(fresh.name)
        module = f"danube/proto/{fresh.name.replace('.proto', '_pb2.py')}"
        problems = compare_descriptors(fresh, generated, labels=("protocol", "generated"))
        if not problems and fresh != generated:
            problems = ["declaration order differs"]
        assert not problems, (
            f"{module} is stale relative to protocol/{fresh.name}; regenerate it "
            f"(python setup.py build_py):\n  " + "\n  ".join(problems))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
