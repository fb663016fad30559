"""`danube admin schemas`: upstream danube-admin's schemas group against the schema registry
(danube_schema.SchemaRegistry, which the broker serves on its admin port too), with its
flags, output lines and JSON keys."""

import json
import os

from danube.cli.admin.common import CommandError, UsageError, add_command, add_group, \
    add_output, u32, u64
from danube.cli.admin.output import emit_json
from danube.proto import SchemaRegistry_pb2 as sr

TYPES = ("json_schema", "avro", "protobuf", "string", "bytes")
MODES = ("none", "backward", "forward", "full")
EXAMPLES = """\
  danube admin schemas register user-events --schema-type json_schema --file schema.json
  danube admin schemas get --subject user-events
  danube admin schemas versions user-events"""


def add_parser(groups):
    cmds = add_group(groups, "schemas", "manage schemas in the schema registry", EXAMPLES)
    p = add_command(cmds, "register", _register, "register a schema (a new version if it differs)",
                    "  danube admin schemas register user-events --schema-type json_schema "
                    "--file schema.json\n"
                    "  danube admin schemas register user-events --schema-type avro "
                    "--schema '{...}'\n"
                    "  danube admin schemas register user-events --schema-type json_schema "
                    "--file schema.json --tags analytics events")
    p.add_argument("subject", help="schema subject name")
    p.add_argument("--schema-type", required=True, choices=TYPES)
    _definition(p)
    p.add_argument("--description", help="human-readable description")
    p.add_argument("--tags", action="extend", nargs="+", default=[], metavar="TAG",
                   help="tags for categorization (repeatable)")
    add_output(p)
    p = add_command(cmds, "get", _get, "get a schema by subject, or by id (and version)",
                    "  danube admin schemas get --subject user-events\n"
                    "  danube admin schemas get --id 42 --version 3\n"
                    "  danube admin schemas get --subject user-events --output json")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--id", type=u64, help="schema id")
    which.add_argument("--subject", help="schema subject (its latest version)")
    p.add_argument("--version", type=u32, help="with --id: this version (default: latest)")
    add_output(p)
    p = add_command(cmds, "versions", _versions, "list all versions of a subject")
    p.add_argument("subject", help="schema subject name")
    add_output(p)
    p = add_command(cmds, "check", _check, "check whether a schema is compatible with a subject",
                    "  danube admin schemas check user-events --schema-type json_schema "
                    "--file new-schema.json --mode backward")
    p.add_argument("subject", help="schema subject name")
    _definition(p)
    p.add_argument("--schema-type", required=True, choices=TYPES[:3])
    p.add_argument("--mode", help="override the compatibility mode (none, backward, forward, "
                                  "full)")
    p = add_command(cmds, "get-compatibility", _get_compatibility,
                    "get the compatibility mode of a subject")
    p.add_argument("subject", help="schema subject name")
    add_output(p)
    p = add_command(cmds, "set-compatibility", _set_compatibility,
                    "set the compatibility mode of a subject",
                    "  danube admin schemas set-compatibility user-events --mode full")
    p.add_argument("subject", help="schema subject name")
    p.add_argument("--mode", required=True, choices=MODES)
    p = add_command(cmds, "delete", _delete, "delete one version of a subject",
                    "  danube admin schemas delete user-events --version 2 --confirm")
    p.add_argument("subject", help="schema subject name")
    p.add_argument("--version", type=u32, required=True, help="version to delete")
    p.add_argument("--confirm", action="store_true",
                   help="required: guards against an accidental deletion")
    p = add_command(cmds, "list-subjects", _list_subjects, "list every registered subject")
    add_output(p)


def _definition(parser):
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--file", help="path to the schema definition file")
    which.add_argument("--schema", help="inline schema definition")


def _read_definition(args):
    if args.file is not None:
        with open(args.file, "rb") as f:
            return f.read()
    if args.schema is not None:
        return args.schema.encode()
    raise CommandError("either --file or --schema must be provided")


async def _register(admin, args):
    data = _read_definition(args)
    r = await admin.call("SchemaRegistry", "RegisterSchema", sr.RegisterSchemaRequest(
        subject=args.subject, schema_type=args.schema_type, schema_definition=data,
        description=args.description or "", created_by=os.environ.get("USER") or "admin",
        tags=args.tags), what=f"register schema {args.subject}")
    if args.output == "json":
        emit_json({"subject": args.subject, "schema_id": r.schema_id, "version": r.version,
                   "is_new_version": r.is_new_version, "fingerprint": r.fingerprint})
        return
    print("✅ Registered new schema version" if r.is_new_version else
          "✅ Schema already exists")
    print(f"Subject: {args.subject}")
    print(f"Schema ID: {r.schema_id}")
    print(f"Version: {r.version}")
    print(f"Fingerprint: {r.fingerprint}")


async def _get(admin, args):
    if args.version is not None and args.id is None:
        raise UsageError("--version requires --id")
    if args.id is not None:
        request = sr.GetSchemaRequest(schema_id=args.id)
        if args.version is not None:
            request.version = args.version
        r = await admin.call("SchemaRegistry", "GetSchema", request,
                             what=f"get schema id {args.id}")
    elif args.subject is not None:
        r = await admin.call("SchemaRegistry", "GetLatestSchema",
                             sr.GetLatestSchemaRequest(subject=args.subject),
                             what=f"get schema {args.subject}")
    else:
        raise CommandError("either --id or --subject must be provided")
    # upstream shows the registry's stored definition as it comes (reference a.2)
    definition = r.schema_definition.decode("utf-8", "replace")
    if args.output == "json":
        emit_json({"schema_id": r.schema_id, "version": r.version, "subject": r.subject,
                   "schema_type": r.schema_type, "schema_definition": definition,
                   "description": r.description, "created_at": r.created_at,
                   "created_by": r.created_by, "tags": list(r.tags),
                   "fingerprint": r.fingerprint,
                   "compatibility_mode": r.compatibility_mode.upper()})
        return
    print(f"Schema ID: {r.schema_id}")
    print(f"Version: {r.version}")
    print(f"Subject: {r.subject}")
    print(f"Type: {r.schema_type}")
    print(f"Compatibility Mode: {r.compatibility_mode.upper()}")
    if r.description:
        print(f"Description: {r.description}")
    if r.tags:
        print(f"Tags: {', '.join(r.tags)}")
    print("\nSchema Definition:")
    if definition.lstrip().startswith("{"):
        try:
            definition = json.dumps(json.loads(definition), indent=2, ensure_ascii=False)
        except ValueError:
            pass
    print(definition)


async def _versions(admin, args):
    resp = await admin.call("SchemaRegistry", "ListVersions",
                            sr.ListVersionsRequest(subject=args.subject),
                            what=f"list versions of {args.subject}")
    if args.output == "json":
        emit_json([{"version": v.version, "schema_id": v.schema_id,
                    "created_at": v.created_at, "created_by": v.created_by,
                    "description": v.description, "fingerprint": v.fingerprint}
                   for v in resp.versions])
        return
    print(f"Versions for subject '{args.subject}':")
    for v in resp.versions:
        print(f"  Version {v.version}: schema_id={v.schema_id}, fingerprint={v.fingerprint}")
        if v.created_by:
            print(f"    Created by: {v.created_by}")
        if v.description:
            print(f"    Description: {v.description}")


async def _check(admin, args):
    request = sr.CheckCompatibilityRequest(subject=args.subject,
                                           new_schema_definition=_read_definition(args),
                                           schema_type=args.schema_type)
    if args.mode is not None:
        request.compatibility_mode = args.mode
    r = await admin.call("SchemaRegistry", "CheckCompatibility", request,
                         what=f"check compatibility with {args.subject}")
    if r.is_compatible:
        print(f"✅ Schema is compatible with subject '{args.subject}'")
        return
    print(f"❌ Schema is NOT compatible with subject '{args.subject}'")
    if r.errors:
        print("\nCompatibility errors:")
        for error in r.errors:
            print(f"  - {error}")


async def _get_compatibility(admin, args):
    r = await admin.call("SchemaRegistry", "GetLatestSchema",
                         sr.GetLatestSchemaRequest(subject=args.subject),
                         what=f"get the compatibility mode of {args.subject}")
    if args.output == "json":
        emit_json({"subject": args.subject, "compatibility_mode": r.compatibility_mode.upper()})
        return
    print(f"Subject: {args.subject}")
    print(f"Compatibility Mode: {r.compatibility_mode.upper()}")


async def _set_compatibility(admin, args):
    mode = args.mode.upper()
    r = await admin.call("SchemaRegistry", "SetCompatibilityMode",
                         sr.SetCompatibilityModeRequest(subject=args.subject,
                                                        compatibility_mode=mode),
                         what=f"set the compatibility mode of {args.subject}")
    if not r.success:
        print("❌ Failed to set compatibility mode")
        if r.message:
            print(f"Error: {r.message}")
        return 1
    print(f"✅ Compatibility mode set for subject '{args.subject}'")
    print(f"Mode: {mode}")


async def _delete(admin, args):
    if not args.confirm:
        raise CommandError("deletion requires the --confirm flag to prevent accidental "
                           "deletion")
    r = await admin.call("SchemaRegistry", "DeleteSchemaVersion",
                         sr.DeleteSchemaVersionRequest(subject=args.subject,
                                                       version=args.version),
                         what=f"delete version {args.version} of {args.subject}")
    if not r.success:
        print("❌ Failed to delete schema version")
        if r.message:
            print(f"Error: {r.message}")
        return 1
    print(f"✅ Deleted version {args.version} of subject '{args.subject}'")


async def _list_subjects(admin, args):
    r = await admin.call("SchemaRegistry", "ListSubjects", sr.ListSubjectsRequest(),
                         what="list schema subjects")
    if args.output == "json":
        emit_json([{"subject": s.subject, "schema_type": s.schema_type,
                    "latest_version": s.latest_version, "schema_id": s.schema_id,
                    "compatibility_mode": s.compatibility_mode, "tags": list(s.tags)}
                   for s in r.subjects])
        return
    if not r.subjects:
        print("No schema subjects found.")
        return
    print(f"Found {len(r.subjects)} schema subject(s):\n")
    for s in r.subjects:
        print(f"Subject: {s.subject}")
        print(f"  Type: {s.schema_type}")
        print(f"  Latest Version: {s.latest_version}")
        print(f"  Schema ID: {s.schema_id}")
        print(f"  Compatibility: {s.compatibility_mode}")
        if s.tags:
            print(f"  Tags: {', '.join(s.tags)}")
        print()
