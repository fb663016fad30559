"""`danube admin security`: roles and bindings through the broker's SecurityAdmin service, and
tokens minted and checked offline (upstream danube-admin's `security` group, reference f.2;
output as upstream's). Ours beyond upstream: tokens signed with a private key (RS256/ES256)
and validated against a public key, and `bindings list` without --scope listing all.

Calls to the broker go through common.run: --endpoint and the DANUBE_ADMIN_* variables
(token, TLS, CA, client certificate, domain) as every `danube admin` group."""

import argparse
import datetime
import json
import os
import time

from danube.cli.admin.common import CommandError, add_command, add_group, add_output, fail

PERMISSIONS_HELP = ("valid permissions: Lookup, Produce, Consume, Replicate, ManageNamespace, "
                    "ManageTopic, ManageSchema, ManageBroker, ManageCluster")
SECRET_ENV = "DANUBE_JWT_SECRET_KEY"


def add_parser(groups):
    kinds = add_group(groups, "security", "manage roles, bindings (RBAC) and tokens (JWT)")
    _roles(kinds)
    _bindings(kinds)
    _tokens(kinds)


def _roles(kinds):
    sub = add_group(kinds, "roles", "manage authorization roles")
    c = add_command(sub, "create", _role_create, "create a role with the given permissions",
                    "  danube admin security roles create producer-role "
                    "--permissions Produce,Lookup\n\n" + PERMISSIONS_HELP)
    c.add_argument("name")
    c.add_argument("--permissions", required=True, help="comma-separated permissions")
    g = add_command(sub, "get", _role_get, "show a role")
    g.add_argument("name")
    add_output(g, "text")
    ls = add_command(sub, "list", _role_list, "list all roles")
    add_output(ls, "text")
    d = add_command(sub, "delete", _role_delete, "delete a role")
    d.add_argument("name")


def _scope_args(p, required=True):
    p.add_argument("--scope", required=required, choices=("cluster", "namespace", "topic"))
    p.add_argument("--resource", default="",
                   help="namespace name or topic path (empty for cluster scope)")


def _bindings(kinds):
    sub = add_group(kinds, "bindings", "manage authorization bindings")
    c = add_command(sub, "create", _binding_create, "grant roles to a principal at a scope",
                    "  danube admin security bindings create b2 --principal-type "
                    "service_account --principal-name my-app \\\n    --roles consumer-role "
                    "--scope topic --resource /default/my-topic")
    c.add_argument("id")
    c.add_argument("--principal-type", required=True,
                   help="service_account, user or broker_internal")
    c.add_argument("--principal-name", required=True)
    c.add_argument("--roles", required=True, help="comma-separated role names")
    _scope_args(c)
    g = add_command(sub, "get", _binding_get, "show a binding")
    g.add_argument("id")
    _scope_args(g)
    add_output(g, "text")
    ls = add_command(sub, "list", _binding_list,
                     "list the bindings of a scope (without --scope: every binding)")
    _scope_args(ls, required=False)
    add_output(ls, "text")
    d = add_command(sub, "delete", _binding_delete, "delete a binding")
    d.add_argument("id")
    _scope_args(d)


def _tokens(kinds):
    sub = add_group(kinds, "tokens", "mint and check authentication tokens (offline)")
    c = sub.add_parser("create", help="mint a signed JWT (no broker needed)",
                       description="Mint a signed JWT (no broker needed).",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  danube admin security tokens create --subject "
                              "my-app --secret-key your-secret-key\n  danube admin security "
                              "tokens create --subject admin-user --type user --ttl 24h\n\nTTL:"
                              " a number with h (hours) or d (days). Default: 8760h (1 year)")
    c.add_argument("--subject", required=True, help="principal name")
    _key_args(c, "--private-key-file", "PEM private key: RS256 (RSA) or ES256 (P-256)")
    c.add_argument("--ttl", default="8760h")
    c.add_argument("--type", default="service_account", dest="principal_type",
                   choices=("service_account", "user", "broker_internal"))
    c.add_argument("--issuer", default="danube-auth")
    c.set_defaults(func=_token_create)
    v = sub.add_parser("validate", help="check a token and show its claims (no broker needed)",
                       description="Check a token and show its claims (no broker needed).")
    v.add_argument("--token", required=True)
    _key_args(v, "--public-key-file", "PEM public key or certificate (RS256/ES256)")
    v.set_defaults(func=_token_validate)


def _key_args(p, key_flag, key_help):
    p.add_argument("--secret-key", default=None,
                   help=f"HS256 secret, the broker's auth.jwt.secret_key (env {SECRET_ENV})")
    p.add_argument(key_flag, default=None, help=f"ours: {key_help}")


def _adm():
    from danube.proto import DanubeAdmin_pb2 as adm
    return adm


def _split(text):
    return [part.strip() for part in text.split(",") if part.strip()]


# -- roles ----------------------------------------------------------------------------------

def _role_json(r):
    return {"name": r.name, "permissions": list(r.permissions), "system": r.system}


def _print_role(r):
    print(f"Role: {r.name}")
    print(f"  Permissions: {', '.join(r.permissions)}")
    if r.system:
        print("  System: true")


async def _role_create(admin, args):
    adm = _adm()
    resp = await admin.call("SecurityAdmin", "CreateRole", adm.CreateRoleRequest(
        role=adm.RoleDefinition(name=args.name, permissions=_split(args.permissions))),
        what=f"create role {args.name}")
    print(f"Role '{args.name}' created: {str(resp.success).lower()}")


async def _role_get(admin, args):
    resp = await admin.call("SecurityAdmin", "GetRole", _adm().GetRoleRequest(name=args.name),
                            what=f"get role {args.name}")
    if args.output == "json":
        print(json.dumps(_role_json(resp.role), indent=2))
    else:
        _print_role(resp.role)


async def _role_list(admin, args):
    resp = await admin.call("SecurityAdmin", "ListRoles", what="list roles")
    if args.output == "json":
        print(json.dumps([_role_json(r) for r in resp.roles], indent=2))
    elif not resp.roles:
        print("No roles found.")
    else:
        for r in resp.roles:
            _print_role(r)
            print()


async def _role_delete(admin, args):
    resp = await admin.call("SecurityAdmin", "DeleteRole",
                            _adm().DeleteRoleRequest(name=args.name),
                            what=f"delete role {args.name}")
    print(f"Role '{args.name}' deleted: {str(resp.success).lower()}")


# -- bindings -------------------------------------------------------------------------------

def _binding_json(b):
    return {"id": b.id, "principal_type": b.principal_type, "principal_name": b.principal_name,
            "role_names": list(b.role_names), "scope": b.scope,
            "resource_name": b.resource_name}


def _print_binding(b):
    print(f"Binding: {b.id}")
    print(f"  Principal: {b.principal_type}:{b.principal_name}")
    print(f"  Roles: {', '.join(b.role_names)}")
    print(f"  Scope: {b.scope}{f' ({b.resource_name})' if b.resource_name else ''}")


async def _binding_create(admin, args):
    adm = _adm()
    resp = await admin.call("SecurityAdmin", "CreateBinding", adm.CreateBindingRequest(
        binding=adm.BindingDefinition(
            id=args.id, principal_type=args.principal_type,
            principal_name=args.principal_name, role_names=_split(args.roles),
            scope=args.scope, resource_name=args.resource)),
        what=f"create binding {args.id}")
    print(f"Binding '{args.id}' created: {str(resp.success).lower()}")


async def _binding_get(admin, args):
    resp = await admin.call("SecurityAdmin", "GetBinding", _adm().GetBindingRequest(
        scope=args.scope, resource_name=args.resource, binding_id=args.id),
        what=f"get binding {args.id}")
    if args.output == "json":
        print(json.dumps(_binding_json(resp.binding), indent=2))
    else:
        _print_binding(resp.binding)


async def _binding_list(admin, args):
    if args.scope is None:
        if args.resource:
            raise CommandError("--resource needs --scope")
        resp = await admin.call("SecurityAdmin", "ListAllBindings", what="list bindings")
    else:
        resp = await admin.call("SecurityAdmin", "ListBindings", _adm().ListBindingsRequest(
            scope=args.scope, resource_name=args.resource), what="list bindings")
    if args.output == "json":
        print(json.dumps([_binding_json(b) for b in resp.bindings], indent=2))
    elif not resp.bindings:
        print("No bindings found.")
    else:
        for b in resp.bindings:
            _print_binding(b)
            print()


async def _binding_delete(admin, args):
    resp = await admin.call("SecurityAdmin", "DeleteBinding", _adm().DeleteBindingRequest(
        scope=args.scope, resource_name=args.resource, binding_id=args.id),
        what=f"delete binding {args.id}")
    print(f"Binding '{args.id}' deleted: {str(resp.success).lower()}")


# -- tokens (offline) -----------------------------------------------------------------------

def _read(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CommandError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


def _token_create(args):
    from danube.security.tokens import KeyConfigError, mint_token, parse_ttl
    secret = args.secret_key or os.environ.get(SECRET_ENV)
    try:
        ttl = parse_ttl(args.ttl)
        if args.private_key_file:
            token = mint_token(args.subject, ttl=ttl, principal_type=args.principal_type,
                               issuer=args.issuer, private_key_pem=_read(
                                   args.private_key_file, "--private-key-file"))
        elif secret:
            token = mint_token(args.subject, secret_key=secret, ttl=ttl,
                               principal_type=args.principal_type, issuer=args.issuer)
        else:
            raise CommandError(f"a signing key is required: --secret-key (or ${SECRET_ENV}), "
                               f"or --private-key-file")
    except (ValueError, KeyConfigError, CommandError) as exc:
        return fail(exc)
    print(token)        # only the token on stdout, for scripts
    return 0


def _remaining(exp):
    secs = int(exp - time.time())
    if secs <= 0:
        return "EXPIRED"
    hours = secs // 3600
    return f"{hours // 24}d {hours % 24}h" if hours >= 24 else f"{hours}h"


def _token_validate(args):
    import jwt

    from danube.security.tokens import KeyConfigError, TokenError, TokenVerifier, \
        load_public_key
    secret = args.secret_key or os.environ.get(SECRET_ENV)
    try:
        public, algs = (load_public_key(args.public_key_file) if args.public_key_file
                        else (None, ()))
        if not secret and public is None:
            raise CommandError(f"a key is required: --secret-key (or ${SECRET_ENV}), or "
                               f"--public-key-file")
        # Upstream's check: signature and exp, whatever the issuer; no leeway.
        verifier = TokenVerifier(secret_key=secret, public_key=public,
                                 public_algorithms=algs, leeway=0)
        verifier.verify(args.token)
    except TokenError as exc:
        return fail(f"Token validation failed: {exc}")
    except (KeyConfigError, CommandError) as exc:
        return fail(exc)
    claims = jwt.decode(args.token, options={"verify_signature": False})
    expires = datetime.datetime.fromtimestamp(claims["exp"], datetime.timezone.utc)
    print("Token is valid.")
    print(f"  Subject:         {claims.get('sub', '')}")
    print(f"  Principal type:  {claims.get('principal_type', '')}")
    print(f"  Principal name:  {claims.get('principal_name', '')}")
    print(f"  Issuer:          {claims.get('iss', '')}")
    print(f"  Expires:         {expires:%Y-%m-%d %H:%M:%S} UTC")
    print(f"  Remaining:       {_remaining(claims['exp'])}")
    return 0
