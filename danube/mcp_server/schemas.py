"""Schema registry tools (upstream's tools/schemas.rs)."""

from datetime import datetime, timezone
from typing import Annotated, Optional

from pydantic import Field

from danube.proto import SchemaRegistry_pb2 as sr

from danube.mcp_server.context import text_tool

SUBJECT = Field(description="Schema subject name. Example: \"user-events-value\"")
TYPE = Field(description="\"json_schema\", \"avro\", \"protobuf\", \"string\", \"number\" or "
                         "\"bytes\".")


def _when(seconds):
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat()
    except (OverflowError, OSError, ValueError):
        return "unknown"


def describe(r):
    return (f"Schema Subject: {r.subject}\nSchema ID: {r.schema_id}\nVersion: {r.version}\n"
            f"Type: {r.schema_type}\nCompatibility: {r.compatibility_mode}\n"
            f"Created: {_when(r.created_at)} (by {r.created_by})\n"
            f"Fingerprint: {r.fingerprint}\n\n"
            f"Definition:\n{r.schema_definition.decode('utf-8', 'replace')}")


def register(mcp, ctx):
    call = ctx.call

    @text_tool(mcp)
    async def register_schema(
            subject: Annotated[str, SUBJECT], schema_type: Annotated[str, TYPE],
            schema_definition: Annotated[str, Field(description=(
                "The schema's text: a JSON Schema, an Avro schema or a .proto file."))],
            description: Annotated[Optional[str], Field(description=(
                "What the schema is for."))] = None) -> str:
        """Register a schema, or a new version of a subject (checked against the subject's
        compatibility mode). Returns the schema ID, version and fingerprint."""
        r = await call("SchemaRegistry", "RegisterSchema", sr.RegisterSchemaRequest(
            subject=subject, schema_type=schema_type,
            schema_definition=schema_definition.encode(), description=description or "",
            created_by="mcp-server"), doing="registering schema")
        status = "New version registered" if r.is_new_version else "Schema already exists"
        return (f"Schema '{subject}' - {status}\nSchema ID: {r.schema_id}\n"
                f"Version: {r.version}\nFingerprint: {r.fingerprint}")

    @text_tool(mcp)
    async def get_schema(subject: Annotated[str, SUBJECT]) -> str:
        """Get the latest version of a subject: ID, version, type, definition,
        compatibility mode, creation and fingerprint."""
        return describe(await call("SchemaRegistry", "GetLatestSchema",
                                   sr.GetLatestSchemaRequest(subject=subject),
                                   doing="getting schema"))

    @text_tool(mcp)
    async def list_schema_versions(subject: Annotated[str, SUBJECT]) -> str:
        """List every version of a subject."""
        r = await call("SchemaRegistry", "ListVersions", sr.ListVersionsRequest(subject=subject),
                       doing="listing versions")
        if not r.versions:
            return f"No versions found for subject '{subject}'"
        out = f"Found {len(r.versions)} version(s) for schema '{subject}':\n\n"
        for v in r.versions:
            out += (f"Version {v.version}: Schema ID {v.schema_id}\n"
                    f"Created: {_when(v.created_at)} (by {v.created_by})\n"
                    f"Description: {v.description}\nFingerprint: {v.fingerprint}\n\n")
        return out

    @text_tool(mcp)
    async def check_schema_compatibility(
            subject: Annotated[str, SUBJECT], schema_type: Annotated[str, TYPE],
            schema_definition: Annotated[str, Field(description="The new schema's text.")]
    ) -> str:
        """Check whether a new schema is compatible with a subject's versions, before
        registering it."""
        r = await call("SchemaRegistry", "CheckCompatibility", sr.CheckCompatibilityRequest(
            subject=subject, new_schema_definition=schema_definition.encode(),
            schema_type=schema_type), doing="checking compatibility")
        if r.is_compatible:
            return f"✓ Schema is COMPATIBLE with subject '{subject}'"
        return (f"✗ Schema is INCOMPATIBLE with subject '{subject}':\n\n" +
                "".join(f"  {i}. {e}\n" for i, e in enumerate(r.errors, 1)))

    @text_tool(mcp)
    async def get_schema_compatibility_mode(subject: Annotated[str, SUBJECT]) -> str:
        """Get a subject's compatibility mode (NONE, BACKWARD, FORWARD or FULL)."""
        r = await call("SchemaRegistry", "GetLatestSchema",
                       sr.GetLatestSchemaRequest(subject=subject),
                       doing="getting compatibility mode")
        return (f"Compatibility mode for subject '{subject}':\n"
                f"  Mode: {r.compatibility_mode.upper()}")

    @text_tool(mcp)
    async def set_schema_compatibility_mode(
            subject: Annotated[str, SUBJECT],
            mode: Annotated[str, Field(description=(
                "\"none\", \"backward\", \"forward\" or \"full\"."))]) -> str:
        """Set a subject's compatibility mode for its future versions."""
        r = await call("SchemaRegistry", "SetCompatibilityMode", sr.SetCompatibilityModeRequest(
            subject=subject, compatibility_mode=mode.upper()),
            doing="setting compatibility mode")
        if not r.success:
            return f"✗ Failed to set compatibility mode for subject '{subject}': {r.message}"
        return f"✓ Compatibility mode set for subject '{subject}'\n  Mode: {mode.upper()}"

    @text_tool(mcp)
    async def delete_schema_version(
            subject: Annotated[str, SUBJECT],
            version: Annotated[int, Field(ge=0, le=2 ** 32 - 1, description=(
                "The version to delete; list_schema_versions shows them."))]) -> str:
        """Delete one version of a subject."""
        r = await call("SchemaRegistry", "DeleteSchemaVersion", sr.DeleteSchemaVersionRequest(
            subject=subject, version=version), doing="deleting schema version")
        if not r.success:
            return f"✗ Failed to delete version {version}: {r.message}"
        return f"✓ Successfully deleted version {version} of schema '{subject}'"

    @text_tool(mcp)
    async def list_subjects() -> str:
        """List every schema subject: type, latest version, schema ID, compatibility, tags."""
        r = await call("SchemaRegistry", "ListSubjects", sr.ListSubjectsRequest(),
                       doing="listing subjects")
        if not r.subjects:
            return "No schema subjects found."
        out = f"Found {len(r.subjects)} schema subject(s):\n\n"
        for s in r.subjects:
            out += (f"Subject: {s.subject}\nType: {s.schema_type}\n"
                    f"Latest Version: {s.latest_version}\nSchema ID: {s.schema_id}\n"
                    f"Compatibility: {s.compatibility_mode}\n")
            if s.tags:
                out += f"  Tags: {', '.join(s.tags)}\n"
            out += "\n"
        return out

    @text_tool(mcp)
    async def get_schema_by_id(
            schema_id: Annotated[int, Field(ge=0, le=2 ** 64 - 1, description=(
                "The global schema ID."))],
            version: Annotated[Optional[int], Field(ge=0, le=2 ** 32 - 1, description=(
                "A version; the latest when omitted."))] = None) -> str:
        """Get a schema by its numeric ID (and version)."""
        req = sr.GetSchemaRequest(schema_id=schema_id)
        if version is not None:
            req.version = version
        return describe(await call("SchemaRegistry", "GetSchema", req, doing="getting schema"))
