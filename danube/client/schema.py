"""The schema-registry calls a producer needs: register a schema (the CLI's --schema-file)
and turn a SchemaReference into the (schema_id, version) stamped on every message (b.3)."""

from danube.client import errors
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import SchemaRegistry_pb2 as sr
from danube.rpc import RpcError


def schema_reference(subject, version=None, min_version=None):
    if version is not None and min_version is not None:
        raise errors.InvalidArgument("a schema version and a minimum version exclude each other")
    if version is not None:
        return pb.SchemaReference(subject=subject, pinned_version=version)
    if min_version is not None:
        return pb.SchemaReference(subject=subject, min_version=min_version)
    return pb.SchemaReference(subject=subject, use_latest=True)


async def resolve_schema(stub, ref, timeout):
    """(schema_id, version) for `ref`: pinned must exist, min must be met, else latest."""
    latest = await stub.get_latest_schema(sr.GetLatestSchemaRequest(subject=ref.subject),
                                          timeout=timeout)
    which = ref.WhichOneof("version_ref")
    if which == "pinned_version":
        if ref.pinned_version > latest.version:
            raise errors.FailedPrecondition(
                f"schema version {ref.pinned_version} of {ref.subject!r} does not exist "
                f"(latest is {latest.version})")
        if ref.pinned_version != latest.version:
            pinned = await stub.get_schema(
                sr.GetSchemaRequest(schema_id=latest.schema_id, version=ref.pinned_version),
                timeout=timeout)
            return pinned.schema_id, pinned.version
    elif which == "min_version" and latest.version < ref.min_version:
        raise errors.FailedPrecondition(
            f"latest version {latest.version} of {ref.subject!r} is below the minimum "
            f"{ref.min_version}")
    return latest.schema_id, latest.version


async def register_schema(client, subject, schema_type, definition, description=""):
    """Register `definition` (bytes) under `subject`; returns RegisterSchemaResponse."""
    stub = client.pool.stub(client.service_url)
    request = sr.RegisterSchemaRequest(subject=subject, schema_type=schema_type,
                                       schema_definition=definition, description=description,
                                       created_by="danube-cli")
    try:
        return await stub.register_schema(request, timeout=client.rpc_timeout)
    except RpcError as exc:
        raise errors.from_rpc(exc, f"register schema {subject!r}") from None
