"""Security tools (upstream's tools/security.rs): roles, bindings, and offline JWTs made and
checked with a signing secret, as `danube admin security tokens` does."""

import time
from datetime import datetime, timezone
from typing import Annotated, Optional

from pydantic import Field

from danube.proto import DanubeAdmin_pb2 as adm
from danube.security import tokens

from danube.mcp_server.context import text_tool

SCOPE = Field(description="\"cluster\", \"namespace\" or \"topic\".")
RESOURCE = Field(description="Empty for the cluster scope, the namespace for a namespace "
                             "scope, the topic path for a topic scope. Example: \"default\"")


def _utc(seconds):
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError, TypeError):
        return "invalid"


def _binding_text(b):
    out = (f"Binding: {b.id}\n  Principal: {b.principal_type}:{b.principal_name}\n"
           f"  Roles: {', '.join(b.role_names)}\n  Scope: {b.scope}")
    if b.resource_name:
        out += f" ({b.resource_name})"
    return out + "\n"


def _split(text):
    return [s.strip() for s in text.split(",")]


def register(mcp, ctx):
    call = ctx.call

    @text_tool(mcp)
    async def create_role(
            name: Annotated[str, Field(description="Role name. Example: \"producer-role\"")],
            permissions: Annotated[str, Field(description=(
                "Comma-separated permissions: Lookup, Produce, Consume, Replicate, "
                "ManageNamespace, ManageTopic, ManageSchema, ManageBroker, ManageCluster. "
                "Example: \"Produce,Lookup\""))]) -> str:
        """Create an authorization role with a set of permissions."""
        r = await call("SecurityAdmin", "CreateRole", adm.CreateRoleRequest(
            role=adm.RoleDefinition(name=name, permissions=_split(permissions))),
            doing="creating role")
        return (f"✓ Role '{name}' created successfully" if r.success
                else f"✗ Failed to create role '{name}'")

    @text_tool(mcp)
    async def get_role(name: Annotated[str, Field(description="Role name.")]) -> str:
        """Show a role's permissions and whether it is a system role."""
        r = await call("SecurityAdmin", "GetRole", adm.GetRoleRequest(name=name),
                       doing="getting role")
        if not r.HasField("role"):
            return f"Role '{name}' not found"
        out = f"Role: {r.role.name}\n  Permissions: {', '.join(r.role.permissions)}\n"
        return out + ("  System: true\n" if r.role.system else "")

    @text_tool(mcp)
    async def list_roles() -> str:
        """List every role with its permissions."""
        r = await call("SecurityAdmin", "ListRoles", doing="listing roles")
        if not r.roles:
            return "No roles found."
        out = f"Found {len(r.roles)} role(s):\n\n"
        for role in r.roles:
            out += f"Role: {role.name}\n  Permissions: {', '.join(role.permissions)}\n"
            out += ("  System: true\n" if role.system else "") + "\n"
        return out

    @text_tool(mcp)
    async def delete_role(name: Annotated[str, Field(description="Role name.")]) -> str:
        """Delete a role (system roles cannot be deleted)."""
        r = await call("SecurityAdmin", "DeleteRole", adm.DeleteRoleRequest(name=name),
                       doing="deleting role")
        return (f"✓ Role '{name}' deleted successfully" if r.success
                else f"✗ Failed to delete role '{name}'")

    @text_tool(mcp)
    async def create_binding(
            id: Annotated[str, Field(description="Binding ID. Example: \"b1\"")],
            principal_type: Annotated[str, Field(description=(
                "\"service_account\" or \"user\"."))],
            principal_name: Annotated[str, Field(description="Example: \"my-app\"")],
            roles: Annotated[str, Field(description="Comma-separated role names.")],
            scope: Annotated[str, SCOPE],
            resource: Annotated[Optional[str], RESOURCE] = None) -> str:
        """Grant roles to a principal at a scope."""
        r = await call("SecurityAdmin", "CreateBinding", adm.CreateBindingRequest(
            binding=adm.BindingDefinition(
                id=id, principal_type=principal_type, principal_name=principal_name,
                role_names=_split(roles), scope=scope, resource_name=resource or "")),
            doing="creating binding")
        return (f"✓ Binding '{id}' created successfully" if r.success
                else f"✗ Failed to create binding '{id}'")

    @text_tool(mcp)
    async def get_binding(id: Annotated[str, Field(description="Binding ID.")],
                          scope: Annotated[str, SCOPE],
                          resource: Annotated[Optional[str], RESOURCE] = None) -> str:
        """Show a binding: principal, roles, scope and resource."""
        r = await call("SecurityAdmin", "GetBinding", adm.GetBindingRequest(
            binding_id=id, scope=scope, resource_name=resource or ""), doing="getting binding")
        return _binding_text(r.binding) if r.HasField("binding") else \
            f"Binding '{id}' not found"

    @text_tool(mcp)
    async def list_bindings(scope: Annotated[str, SCOPE],
                            resource: Annotated[Optional[str], RESOURCE] = None) -> str:
        """List the bindings of a scope (and resource)."""
        r = await call("SecurityAdmin", "ListBindings", adm.ListBindingsRequest(
            scope=scope, resource_name=resource or ""), doing="listing bindings")
        if not r.bindings:
            where = f" resource '{resource}'" if resource else ""
            return f"No bindings found for scope '{scope}'{where}"
        return f"Found {len(r.bindings)} binding(s):\n\n" + "".join(
            _binding_text(b) + "\n" for b in r.bindings)

    @text_tool(mcp)
    async def delete_binding(id: Annotated[str, Field(description="Binding ID.")],
                             scope: Annotated[str, SCOPE],
                             resource: Annotated[Optional[str], RESOURCE] = None) -> str:
        """Delete a binding (its principal loses those roles)."""
        r = await call("SecurityAdmin", "DeleteBinding", adm.DeleteBindingRequest(
            binding_id=id, scope=scope, resource_name=resource or ""),
            doing="deleting binding")
        return (f"✓ Binding '{id}' deleted successfully" if r.success
                else f"✗ Failed to delete binding '{id}'")

    @text_tool(mcp)
    async def create_token(
            subject: Annotated[str, Field(description="The principal's name.")],
            secret_key: Annotated[str, Field(description=(
                "The broker's auth.jwt.secret_key."))],
            ttl: Annotated[Optional[str], Field(description=(
                "Lifetime: hours (\"24h\") or days (\"365d\"). Default: \"8760h\""))] = None,
            principal_type: Annotated[Optional[str], Field(description=(
                "\"service_account\" or \"user\". Default: \"service_account\""))] = None,
            issuer: Annotated[Optional[str], Field(description=(
                "The broker's auth.jwt.issuer. Default: \"danube-auth\""))] = None) -> str:
        """Make a signed JWT offline (no broker needed) with the broker's secret."""
        ttl_text = ttl or "8760h"
        try:
            seconds = tokens.parse_ttl(ttl_text)
        except ValueError as exc:
            return f"Error: {exc}"
        ptype = principal_type or "service_account"
        now = int(time.time())
        try:
            token = tokens.mint_token(subject, secret_key=secret_key, ttl=seconds,
                                      principal_type=ptype, issuer=issuer or "danube-auth",
                                      now=now)
        except Exception as exc:
            return f"Error creating token: {exc}"
        return (f"✓ Token created successfully\nSubject: {subject}\nPrincipal Type: {ptype}\n"
                f"Expires: {_utc(now + seconds)}\nTTL: {ttl_text}\n\nToken:\n{token}")

    @text_tool(mcp)
    async def validate_token(
            token: Annotated[str, Field(description="The JWT.")],
            secret_key: Annotated[str, Field(description="The secret it was signed with.")]
    ) -> str:
        """Check a JWT's signature and expiry offline and show its claims."""
        import jwt
        try:
            claims = jwt.decode(token, secret_key, algorithms=["HS256"],
                                options={"require": ["exp", "sub"]})
        except jwt.exceptions.InvalidTokenError as exc:
            return f"✗ Token validation failed: {exc}"
        exp = claims.get("exp")
        left = int(exp - time.time()) if isinstance(exp, (int, float)) else -1
        hours = left // 3600
        remaining = "EXPIRED" if left <= 0 else \
            f"{hours // 24}d {hours % 24}h" if hours >= 24 else f"{hours}h"
        return (f"✓ Token is valid\nSubject: {claims.get('sub')}\n"
                f"Principal Type: {claims.get('principal_type')}\n"
                f"Principal Name: {claims.get('principal_name')}\n"
                f"Issuer: {claims.get('iss')}\nExpires: {_utc(exp)}\nRemaining: {remaining}")
