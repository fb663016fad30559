"""Role-based access control with default deny (reference b.8).

Roles (`/auth/roles/{name}`) hold permissions; bindings (`/auth/bindings/...`) give roles to
a principal (type and name) at the cluster, a namespace or a topic. Both live in the
MetadataStore, as upstream's JSON, and are read on every call from an in-memory snapshot
that is rebuilt after each write made here and on every change a watch of `/auth` reports,
so a change made through any broker sharing the store takes effect without a restart.

A check on a topic consults the topic's bindings, its namespace's and the cluster's; on a
partition (`/ns/t-part-3`) also the partitioned topic's (`/ns/t`: ours, so that a binding on
a partitioned topic covers the partitions its clients actually call). A namespace check
consults the namespace's and the cluster's. Super admins (`auth.super_admins`) and
`broker_internal` principals are allowed everything, as upstream.
"""

import asyncio
import logging
import re

from danube.metadata import keys

log = logging.getLogger("danube.security")

PERMISSIONS = ("Lookup", "Produce", "Consume", "Replicate", "ManageNamespace", "ManageTopic",
               "ManageSchema", "ManageBroker", "ManageCluster")
SCOPES = ("cluster", "namespace", "topic")
_PARTITION = re.compile(r"^(/[^/]*/.+)-part-\d+$")


class Resource(tuple):
    """(scope, name): ("cluster", ""), ("namespace", ns) or ("topic", "/ns/t")."""
    __slots__ = ()

    def __new__(cls, scope, name=""):
        return tuple.__new__(cls, (scope, name))

    scope = property(lambda self: self[0])
    name = property(lambda self: self[1])

    def __str__(self):
        return "the cluster" if self[0] == "cluster" else f"{self[0]} {self[1]!r}"


CLUSTER = Resource("cluster")


def topic(name):
    return Resource("topic", name)


def namespace(name):
    return Resource("namespace", name) if name else CLUSTER


def _namespace_of(topic_name):
    parts = topic_name.split("/")
    return parts[1] if len(parts) == 3 and not parts[0] and parts[1] else None


class Rbac:
    """The roles and bindings, their snapshot, and the decision."""

    def __init__(self, store, super_admins=()):
        self.store = store
        self.super_admins = frozenset(super_admins)
        self.roles = {}              # name -> {"name", "permissions", "system"}
        self.bindings = {}           # (scope, resource_name) -> [binding dicts]
        self.listeners = []          # called (no arguments) after each reload
        self._watch_task = None
        self._reload_lock = asyncio.Lock()

    # -- the snapshot ---------------------------------------------------------------------

    async def start(self):
        await self.reload()
        self._watch_task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self):
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
            self._watch_task = None

    async def reload(self):
        async with self._reload_lock:
            roles, bindings = {}, {}
            for key, value in await self.store.scan(keys.AUTH_ROLES):
                if isinstance(value, dict) and isinstance(value.get("name"), str):
                    roles[value["name"]] = value
                else:
                    log.warning("skipping malformed role at %s", key)
            for key, value in await self.store.scan(keys.AUTH_BINDINGS):
                if isinstance(value, dict) and value.get("scope") in SCOPES:
                    where = (value["scope"], value.get("resource_name") or "")
                    bindings.setdefault(where, []).append(value)
                else:
                    log.warning("skipping malformed binding at %s", key)
            self.roles, self.bindings = roles, bindings
        for listener in list(self.listeners):
            listener()

    async def _watch(self):
        # Any change under /auth (made by this broker or another sharing the store) rebuilds
        # the snapshot; a watch that overflows or fails is opened again after a full reload.
        while True:
            try:
                async with await self.store.watch("/auth") as watch:
                    await self.reload()
                    async for _event in watch:
                        await self.reload()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep watching whatever went wrong
                log.warning("authorization watch ended (%s); reopening", exc)
                await asyncio.sleep(1.0)

    # -- the decision ---------------------------------------------------------------------

    def candidate_bindings(self, resource):
        """The binding lists that apply to `resource`, most general first."""
        bindings = self.bindings
        found = [bindings.get(("cluster", ""), ())]
        scope, name = resource
        if scope == "namespace":
            found.append(bindings.get(("namespace", name), ()))
        elif scope == "topic":
            ns = _namespace_of(name)
            if ns is not None:
                found.append(bindings.get(("namespace", ns), ()))
            found.append(bindings.get(("topic", name), ()))
            if "-part-" in name:
                m = _PARTITION.match(name)
                if m:
                    found.append(bindings.get(("topic", m.group(1)), ()))
        return found

    def grant(self, principal, permission, resource):
        """The (binding, role name) that allows it, True for a super admin, else None."""
        if principal.type == "broker_internal" or principal.name in self.super_admins:
            return True
        ptype, pname, roles = principal.type, principal.name, self.roles
        for group in self.candidate_bindings(resource):
            for binding in group:
                if (binding.get("principal_name") != pname
                        or binding.get("principal_type") != ptype):
                    continue
                for role_name in binding.get("role_names") or ():
                    role = roles.get(role_name)
                    if role is not None and permission in (role.get("permissions") or ()):
                        return binding, role_name
        return None

    def decide(self, principal, permission, resource):
        """(allowed, reason)."""
        granted = self.grant(principal, permission, resource)
        if granted is True:
            return True, f"{principal} is a super admin"
        if granted is not None:
            binding, role_name = granted
            return True, (f"granted by binding {binding.get('id')!r} via role {role_name!r} "
                          f"(scope {binding.get('scope')})")
        return False, (f"{principal} is not allowed {permission} on {resource}: no binding "
                       f"grants it")

    # -- reads and writes for SecurityAdmin -----------------------------------------------

    def role(self, name):
        return self.roles.get(name)

    def binding(self, scope, resource_name, binding_id):
        for b in self.bindings.get((scope, resource_name if scope != "cluster" else ""), ()):
            if b.get("id") == binding_id:
                return b
        return None

    def list_bindings(self, scope, resource_name):
        return list(self.bindings.get((scope, resource_name if scope != "cluster" else ""),
                                      ()))

    def all_bindings(self):
        return [b for where in sorted(self.bindings) for b in self.bindings[where]]

    async def put_role(self, role):
        await self.store.put(keys.auth_role(role["name"]), role)
        await self.reload()

    async def delete_role(self, name):
        await self.store.delete(keys.auth_role(name))
        await self.reload()

    async def put_binding(self, binding):
        if binding["scope"] == "cluster":
            binding = dict(binding, resource_name="")
        await self.store.put(keys.auth_binding(binding["scope"], binding["resource_name"],
                                          binding["id"]), binding)
        await self.reload()

    async def delete_binding(self, scope, resource_name, binding_id):
        await self.store.delete(keys.auth_binding(scope, resource_name, binding_id))
        await self.reload()
