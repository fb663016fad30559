"""danube_admin.SecurityAdmin on a real broker (issue 22): upstream's checks and status codes
(security_admin.rs), records kept across a restart, and the service working (unenforced) in
auth.mode none."""

import grpc
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeAdmin_pb2 as adm
from secure_broker import SUPER, Caller, Security, start_secure, token

pytestmark = pytest.mark.timeout(120)

SA = "/danube_admin.SecurityAdmin/"


@pytest.fixture(scope="module")
def env(tmp_path_factory, certs):
    b = start_secure(tmp_path_factory.mktemp("secadmin"), certs)
    admin = Caller(b.admin_addr, certs)
    yield b, admin
    admin.close()
    if b.proc.poll() is None:
        assert b.stop() == 0


def call(admin, method, request, response_cls):
    return admin.code(SA + method, request, response_cls, token=token(SUPER))


def _binding(**over):
    d = dict(id="b", principal_type="service_account", principal_name="app",
             role_names=["r"], scope="cluster", resource_name="")
    d.update(over)
    return adm.CreateBindingRequest(binding=adm.BindingDefinition(**d))


@pytest.mark.parametrize("request_, message", [
    (adm.CreateRoleRequest(), "role is required"),
    (adm.CreateRoleRequest(role=adm.RoleDefinition(permissions=["Lookup"])),
     "role name is required"),
    (adm.CreateRoleRequest(role=adm.RoleDefinition(name="x", permissions=["Fly"])),
     "unknown permission: Fly"),
    (adm.CreateRoleRequest(role=adm.RoleDefinition(name="a/b", permissions=["Lookup"])),
     "must not contain '/'"),
])
def test_create_role_checks(env, request_, message):
    code, details = call(env[1], "CreateRole", request_, adm.CreateRoleResponse)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details


@pytest.mark.parametrize("request_, message", [
    (adm.CreateBindingRequest(), "binding is required"),
    (_binding(id=""), "binding id is required"),
    (_binding(principal_name=""), "principal_type and principal_name are required"),
    (_binding(principal_type="robot"), "unknown principal_type: robot"),
    (_binding(role_names=[]), "at least one role_name is required"),
    (_binding(scope="galaxy"), "invalid scope: galaxy"),
    (_binding(scope="topic", resource_name=""), "needs a resource_name"),
])
def test_create_binding_checks(env, request_, message):
    code, details = call(env[1], "CreateBinding", request_, adm.CreateBindingResponse)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details


def test_missing_records_are_not_found_and_system_roles_stay(env):
    admin = env[1]
    assert call(admin, "GetRole", adm.GetRoleRequest(name="nope"), adm.GetRoleResponse) == (
        grpc.StatusCode.NOT_FOUND, "role 'nope' not found")
    assert call(admin, "DeleteRole", adm.DeleteRoleRequest(name="nope"),
                adm.DeleteRoleResponse)[0] == grpc.StatusCode.NOT_FOUND
    assert call(admin, "GetBinding", adm.GetBindingRequest(
        scope="cluster", binding_id="nope"), adm.GetBindingResponse) == (
        grpc.StatusCode.NOT_FOUND, "binding 'nope' not found")
    assert call(admin, "ListBindings", adm.ListBindingsRequest(scope="x"),
                adm.ListBindingsResponse)[0] == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = call(admin, "CreateRole", adm.CreateRoleRequest(role=adm.RoleDefinition(
        name="sys", permissions=["Lookup"], system=True)), adm.CreateRoleResponse)
    assert code == grpc.StatusCode.OK
    assert call(admin, "DeleteRole", adm.DeleteRoleRequest(name="sys"),
                adm.DeleteRoleResponse) == (grpc.StatusCode.FAILED_PRECONDITION,
                                            "cannot delete system role 'sys'")


def test_records_round_trip_and_survive_a_restart(env):
    b, admin = env
    sec = Security(admin)
    sec.role("keeper", "Lookup", "Consume")
    sec.bind("k1", "app", ["keeper"], "namespace", "default")
    sec.bind("k2", "app", ["keeper"], "topic", "/default/kept")
    code, resp = call(admin, "ListBindings", adm.ListBindingsRequest(
        scope="topic", resource_name="/default/kept"), adm.ListBindingsResponse)
    assert [x.id for x in resp.bindings] == ["k2"]
    assert resp.bindings[0].resource_name == "/default/kept"
    assert b.stop() == 0
    again = BrokerProcess(*b.args[b.args.index("--config-file"):],
                          data_dir=b.data_dir).start()
    c = Caller(again.admin_addr, admin.certs)
    try:
        code, resp = c.code(SA + "GetRole", adm.GetRoleRequest(name="keeper"),
                            adm.GetRoleResponse, token=token(SUPER))
        assert code == grpc.StatusCode.OK and list(resp.role.permissions) == ["Lookup",
                                                                               "Consume"]
        code, resp = c.code(SA + "ListAllBindings", adm.Empty(), adm.ListBindingsResponse,
                            token=token(SUPER))
        assert {x.id for x in resp.bindings} >= {"k1", "k2"}
    finally:
        c.close()
        assert again.stop() == 0


def test_security_admin_in_mode_none_stores_but_does_not_enforce(tmp_path):
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    try:
        channel = grpc.insecure_channel(b.admin_addr)
        fn = channel.unary_unary(SA + "CreateRole",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=adm.CreateRoleResponse.FromString)
        assert fn(adm.CreateRoleRequest(role=adm.RoleDefinition(
            name="r", permissions=["Lookup"])), timeout=5).success
        channel.close()
    finally:
        assert b.stop() == 0
