"""danube_admin.SecurityAdmin (reference a.3): roles and bindings, with upstream's checks and
codes (danube-broker/src/admin/security_admin.rs). Who may call it (ManageCluster) is the
guard's business (danube/security/guard.py); this module keeps the records.

Ours beyond upstream: names that would break the key layout (a '/' in a role name or binding
id) and unknown principal types are refused with INVALID_ARGUMENT instead of being stored."""

import logging

from danube.proto import DanubeAdmin_pb2 as pb
from danube.rpc import RpcError, StatusCode
from danube.security.rbac import PERMISSIONS, SCOPES
from danube.security.tokens import PRINCIPAL_TYPES

log = logging.getLogger("danube.security")


def _invalid(message):
    return RpcError(StatusCode.INVALID_ARGUMENT, message)


def _scope(scope):
    if scope not in SCOPES:
        raise _invalid(f"invalid scope: {scope} (expected cluster, namespace, or topic)")


def _no_slash(value, what):
    if "/" in value:
        raise _invalid(f"{what} must not contain '/': {value!r}")
    _printable(value, what)


def _printable(value, what):
    # Names become metadata keys, which cannot hold NUL (and no name needs a control
    # character): refused here, not as a store failure.
    if not value.isprintable():
        raise _invalid(f"{what} must not contain control characters: {value!r}")


def role_to_proto(role):
    return pb.RoleDefinition(name=role["name"], permissions=list(role.get("permissions") or ()),
                             system=bool(role.get("system")))


def binding_to_proto(b):
    return pb.BindingDefinition(id=b.get("id", ""), principal_type=b.get("principal_type", ""),
                                principal_name=b.get("principal_name", ""),
                                role_names=list(b.get("role_names") or ()),
                                scope=b.get("scope", ""),
                                resource_name=b.get("resource_name", ""))


async def _stored(what, write):
    try:
        await write
    except Exception as exc:  # noqa: BLE001 - upstream: any store failure is INTERNAL
        raise RpcError(StatusCode.INTERNAL, f"failed to {what}: {exc}") from None


class SecurityAdmin:
    def __init__(self, rbac):
        self.rbac = rbac

    # -- roles --------------------------------------------------------------------------

    async def CreateRole(self, request, context):
        if not request.HasField("role"):
            raise _invalid("role is required")
        d = request.role
        if not d.name:
            raise _invalid("role name is required")
        _no_slash(d.name, "role name")
        for p in d.permissions:
            if p not in PERMISSIONS:
                raise _invalid(f"unknown permission: {p}")
        role = {"name": d.name, "permissions": list(d.permissions), "system": d.system}
        await _stored("store role", self.rbac.put_role(role))
        log.info("created role %r: %s", d.name, ", ".join(d.permissions) or "no permissions")
        return pb.CreateRoleResponse(success=True)

    def _role(self, name):
        role = self.rbac.role(name)
        if role is None:
            raise RpcError(StatusCode.NOT_FOUND, f"role '{name}' not found")
        return role

    async def GetRole(self, request, context):
        return pb.GetRoleResponse(role=role_to_proto(self._role(request.name)))

    async def ListRoles(self, request, context):
        roles = [self.rbac.roles[name] for name in sorted(self.rbac.roles)]
        return pb.ListRolesResponse(roles=[role_to_proto(r) for r in roles])

    async def DeleteRole(self, request, context):
        role = self._role(request.name)
        if role.get("system"):
            raise RpcError(StatusCode.FAILED_PRECONDITION,
                           f"cannot delete system role '{request.name}'")
        await _stored("delete role", self.rbac.delete_role(request.name))
        log.info("deleted role %r", request.name)
        return pb.DeleteRoleResponse(success=True)

    # -- bindings -----------------------------------------------------------------------

    async def CreateBinding(self, request, context):
        if not request.HasField("binding"):
            raise _invalid("binding is required")
        d = request.binding
        if not d.id:
            raise _invalid("binding id is required")
        _no_slash(d.id, "binding id")
        if not d.principal_type or not d.principal_name:
            raise _invalid("principal_type and principal_name are required")
        if d.principal_type not in PRINCIPAL_TYPES:
            raise _invalid(f"unknown principal_type: {d.principal_type} (expected "
                           f"{', '.join(PRINCIPAL_TYPES)})")
        if not d.role_names:
            raise _invalid("at least one role_name is required")
        _scope(d.scope)
        resource = "" if d.scope == "cluster" else d.resource_name
        if d.scope != "cluster" and not resource.strip("/"):
            raise _invalid(f"a {d.scope} binding needs a resource_name")
        _printable(resource, "resource_name")
        binding = {"id": d.id, "principal_type": d.principal_type,
                   "principal_name": d.principal_name, "role_names": list(d.role_names),
                   "scope": d.scope, "resource_name": resource}
        await _stored("store binding", self.rbac.put_binding(binding))
        log.info("created binding %r: %s:%s gets %s on %s %s", d.id, d.principal_type,
                 d.principal_name, ", ".join(d.role_names), d.scope, resource or "")
        return pb.CreateBindingResponse(success=True)

    def _binding(self, request):
        _scope(request.scope)
        b = self.rbac.binding(request.scope, request.resource_name, request.binding_id)
        if b is None:
            raise RpcError(StatusCode.NOT_FOUND, f"binding '{request.binding_id}' not found")
        return b

    async def GetBinding(self, request, context):
        return pb.GetBindingResponse(binding=binding_to_proto(self._binding(request)))

    async def ListBindings(self, request, context):
        _scope(request.scope)
        bindings = self.rbac.list_bindings(request.scope, request.resource_name)
        return pb.ListBindingsResponse(bindings=[binding_to_proto(b) for b in bindings])

    async def ListAllBindings(self, request, context):
        return pb.ListBindingsResponse(
            bindings=[binding_to_proto(b) for b in self.rbac.all_bindings()])

    async def DeleteBinding(self, request, context):
        b = self._binding(request)
        await _stored("delete binding", self.rbac.delete_binding(
            b["scope"], b.get("resource_name", ""), b["id"]))
        log.info("deleted binding %r", request.binding_id)
        return pb.DeleteBindingResponse(success=True)


def register(server, rbac):
    server.add_service(pb.DESCRIPTOR.services_by_name["SecurityAdmin"], SecurityAdmin(rbac))
