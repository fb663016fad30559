"""`danube schema`: upstream danube-cli's schema command (same subcommands, flags and output
lines), with `list` and `delete` working (upstream's are stubs)."""

import argparse
import asyncio
import json
import sys

from danube.cli.connect import add_connection_options

TYPES = ("json_schema", "avro", "protobuf", "string", "bytes", "number")

EPILOG = """\
examples:
  danube schema register orders -t json_schema -f orders.json
  danube schema get orders            danube schema get orders -v 1 -o json
  danube schema versions orders       danube schema check orders -t json_schema -f v2.json
  danube schema list                  danube schema delete orders -v 2
  danube schema -s http://broker:6650 list -o json
"""


def _version(value):
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"versions start at 1, got {number}")
    return number


def add_parser(sub):
    p = sub.add_parser("schema", help="schema registry: register, get, check, list, delete",
                       description="Work with the broker's schema registry "
                                   "(upstream danube-cli schema).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-s", "--service-addr", default="http://127.0.0.1:6650",
                   help="broker service URL (default http://127.0.0.1:6650)")
    add_connection_options(p)
    cmds = p.add_subparsers(dest="schema_command", required=True, metavar="COMMAND")

    def output(q):
        q.add_argument("-o", "--output", choices=("table", "json"), default="table")

    q = cmds.add_parser("register", help="register a schema (a new version if it differs)")
    q.add_argument("subject")
    q.add_argument("-t", "--schema-type", required=True, choices=TYPES)
    q.add_argument("-f", "--file", required=True, help="schema definition file")
    q.add_argument("--description", default="")
    output(q)
    q = cmds.add_parser("get", help="a subject's latest schema, or one version")
    q.add_argument("subject")
    q.add_argument("-v", "--version", type=_version)
    output(q)
    q = cmds.add_parser("versions", help="a subject's versions")
    q.add_argument("subject")
    output(q)
    q = cmds.add_parser("check", help="is a schema compatible with a subject's versions?")
    q.add_argument("subject")
    q.add_argument("-t", "--schema-type", required=True, choices=TYPES)
    q.add_argument("-f", "--file", required=True, help="schema definition file")
    q.add_argument("--mode", choices=("none", "backward", "forward", "full"),
                   help="check in this mode instead of the subject's")
    output(q)
    q = cmds.add_parser("list", help="every subject")
    output(q)
    q = cmds.add_parser("delete", help="delete a version (the subject with its last one)")
    q.add_argument("subject")
    q.add_argument("-v", "--version", type=_version,
                   help="the version to delete (default: every version, the whole subject)")
    q.add_argument("--permanent", action="store_true",
                   help="accepted for upstream's flag; deletions are always permanent")
    output(q)
    p.set_defaults(func=run)


def run(args):
    sys.stdout.reconfigure(errors="backslashreplace", line_buffering=True)
    try:
        return asyncio.run(_run(args))
    except OSError as exc:
        print(f"danube schema: error: cannot read {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return 1


async def _run(args):
    from danube.cli.connect import ConnectError, make_client
    from danube.client import DanubeError

    try:
        client = make_client(args)
    except (DanubeError, ConnectError) as exc:
        print(f"danube schema: error: {exc}", file=sys.stderr)
        return 1
    try:
        return await COMMANDS[args.schema_command](Calls(client), args)
    except DanubeError as exc:
        print(f"danube schema: error: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()


class Calls:
    """The registry calls, each raising a DanubeError that names what was being done."""

    def __init__(self, client):
        self.client = client
        self.stub = client.pool.stub(client.service_url)

    async def __call__(self, method, request, what):
        from danube.client import errors
        from danube.rpc import RpcError
        try:
            return await getattr(self.stub, method)(request, timeout=self.client.rpc_timeout)
        except RpcError as exc:
            raise errors.from_rpc(exc, what) from None


def _say(args, text):
    # With -o json, progress lines go to stderr so stdout is only the JSON (upstream's way).
    print(text, file=sys.stderr if args.output == "json" else sys.stdout)


def _json(obj):
    print(json.dumps(obj, indent=2))


async def _register(call, args):
    from danube.proto import SchemaRegistry_pb2 as sr
    data = open(args.file, "rb").read()
    _say(args, f"📤 Registering schema '{args.subject}' (type: {args.schema_type})...")
    resp = await call("register_schema", sr.RegisterSchemaRequest(
        subject=args.subject, schema_type=args.schema_type, schema_definition=data,
        description=args.description, created_by="danube-cli"),
        f"register schema {args.subject!r}")
    if args.output == "json":
        _json({"success": True, "subject": args.subject, "schema_id": resp.schema_id,
               "version": resp.version, "is_new_version": resp.is_new_version,
               "schema_type": args.schema_type, "fingerprint": resp.fingerprint})
    else:
        print("✅ Schema registered successfully!" if resp.is_new_version else
              "✅ Schema already registered (identical to an existing version)")
        print(f"   Subject: {args.subject}")
        print(f"   Schema ID: {resp.schema_id}")
        print(f"   Version: {resp.version}")
        print(f"   Type: {args.schema_type}")
    return 0


def raw_definition(resp):
    """The schema text inside GetSchemaResponse.schema_definition (upstream's serde-JSON
    SchemaDefinition), or None for bytes/string/number."""
    try:
        wrapped = json.loads(resp.schema_definition)
    except ValueError:
        return resp.schema_definition.decode("utf-8", "replace")
    if isinstance(wrapped, dict):
        inner = next(iter(wrapped.values()), {})
        return inner.get("raw_schema", inner.get("raw_proto"))
    return None


async def _get(call, args):
    from danube.proto import SchemaRegistry_pb2 as sr
    if args.version is None:
        _say(args, f"🔍 Fetching latest schema for subject '{args.subject}'...")
        resp = await call("get_latest_schema", sr.GetLatestSchemaRequest(subject=args.subject),
                          f"get schema {args.subject!r}")
    else:
        _say(args, f"🔍 Fetching version {args.version} of subject '{args.subject}'...")
        latest = await call("get_latest_schema", sr.GetLatestSchemaRequest(subject=args.subject),
                            f"get schema {args.subject!r}")
        resp = await call("get_schema", sr.GetSchemaRequest(schema_id=latest.schema_id,
                                                            version=args.version),
                          f"get version {args.version} of {args.subject!r}")
    text = raw_definition(resp)
    if args.output == "json":
        _json({"subject": resp.subject, "version": resp.version, "schema_id": resp.schema_id,
               "schema_type": resp.schema_type, "schema_definition": text,
               "fingerprint": resp.fingerprint,
               "compatibility_mode": resp.compatibility_mode})
        return 0
    print("✅ Schema details:")
    print(f"   Subject: {resp.subject}")
    print(f"   Version: {resp.version}")
    print(f"   Schema ID: {resp.schema_id}")
    print(f"   Type: {resp.schema_type}")
    print(f"   Compatibility: {resp.compatibility_mode}")
    print(f"   Fingerprint: {resp.fingerprint}")
    print("\n   Schema Definition:")
    if text is None:
        print(f"   ({resp.schema_type}: no definition)")
    elif resp.schema_type in ("json_schema", "avro"):
        try:
            print(json.dumps(json.loads(text), indent=2))
        except ValueError:
            print(text)
    else:
        print(text)
    return 0


async def _versions(call, args):
    from danube.proto import SchemaRegistry_pb2 as sr
    _say(args, f"📋 Listing versions for subject '{args.subject}'...")
    resp = await call("list_versions", sr.ListVersionsRequest(subject=args.subject),
                      f"list versions of {args.subject!r}")
    versions = [v.version for v in resp.versions]
    if args.output == "json":
        _json({"subject": args.subject, "versions": versions, "count": len(versions),
               "details": [{"version": v.version, "schema_id": v.schema_id,
                            "created_at": v.created_at, "created_by": v.created_by,
                            "description": v.description, "fingerprint": v.fingerprint}
                           for v in resp.versions]})
    elif not versions:
        print(f"⚠️  No versions found for subject '{args.subject}'")
    else:
        print(f"✅ Found {len(versions)} version(s):")
        for v in versions:
            print(f"   • v{v}")
    return 0


async def _check(call, args):
    from danube.proto import SchemaRegistry_pb2 as sr
    data = open(args.file, "rb").read()
    _say(args, f"🔍 Checking compatibility for subject '{args.subject}'...")
    request = sr.CheckCompatibilityRequest(subject=args.subject, schema_type=args.schema_type,
                                           new_schema_definition=data)
    if args.mode:
        request.compatibility_mode = args.mode
    resp = await call("check_compatibility", request,
                      f"check compatibility with {args.subject!r}")
    if args.output == "json":
        _json({"subject": args.subject, "is_compatible": resp.is_compatible,
               "errors": list(resp.errors)})
    elif resp.is_compatible:
        print("✅ Schema is COMPATIBLE")
        print(f"   Safe to register as a new version for '{args.subject}'")
    else:
        print("❌ Schema is NOT COMPATIBLE")
        print(f"   Subject: {args.subject}")
        if resp.errors:
            print("\n   Compatibility errors:")
            for error in resp.errors:
                print(f"   • {error}")
    return 0 if resp.is_compatible else 1


async def _list(call, args):
    from danube.proto import SchemaRegistry_pb2 as sr
    resp = await call("list_subjects", sr.ListSubjectsRequest(), "list subjects")
    rows = [{"subject": s.subject, "schema_type": s.schema_type,
             "latest_version": s.latest_version, "compatibility_mode": s.compatibility_mode,
             "schema_id": s.schema_id, "tags": list(s.tags)} for s in resp.subjects]
    if args.output == "json":
        _json(rows)
        return 0
    if not rows:
        print("⚠️  No schema subjects registered")
        return 0
    header = ("SUBJECT", "TYPE", "LATEST", "MODE", "ID")
    table = [header] + [(r["subject"], r["schema_type"], f"v{r['latest_version']}",
                         r["compatibility_mode"], str(r["schema_id"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


async def _delete(call, args):
    from danube.proto import SchemaRegistry_pb2 as sr
    if args.version is not None:
        versions = [args.version]
    else:
        resp = await call("list_versions", sr.ListVersionsRequest(subject=args.subject),
                          f"list versions of {args.subject!r}")
        versions = [v.version for v in resp.versions]
    for version in versions:
        await call("delete_schema_version",
                   sr.DeleteSchemaVersionRequest(subject=args.subject, version=version),
                   f"delete version {version} of {args.subject!r}")
    if args.output == "json":
        _json({"success": True, "subject": args.subject, "deleted_versions": versions})
    else:
        print(f"🗑️  Deleted version(s) {', '.join(f'v{v}' for v in versions)} of subject "
              f"'{args.subject}'")
    return 0


COMMANDS = {"register": _register, "get": _get, "versions": _versions, "check": _check,
            "list": _list, "delete": _delete}
