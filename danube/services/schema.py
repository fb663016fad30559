"""danube_schema.SchemaRegistry on both ports (reference a.2, e): the registry's calls
(danube.broker.schemas.registry) and the topic-binding calls (danube.broker.core.schemas).

Wire forms as upstream sends them: ``schema_definition`` is the serde-JSON of upstream's
SchemaDefinition enum (not the raw text), compatibility modes and policies are lowercase,
``schema_id`` names a subject. Codes: INVALID_ARGUMENT for a malformed request or schema,
NOT_FOUND for an unknown subject, id, version or topic, FAILED_PRECONDITION for an
incompatible schema (upstream: INTERNAL; see docs/schema-registry.md)."""

from danube.broker.schemas.registry import normalize_mode
from danube.proto import SchemaRegistry_pb2 as sr
from danube.services.errors import maps_errors


class SchemaRegistryService:
    def __init__(self, core):
        self.registry = core.schemas
        self.bindings = core.topic_schemas      # topics' bindings (TopicSchemas)

    def _schema_response(self, doc, entry):
        definition = self.registry.definition(entry)
        return sr.GetSchemaResponse(
            schema_id=doc["id"], version=entry["version"], subject=doc["subject"],
            schema_type=entry["schema_type"],
            schema_definition=definition.definition_json.encode(),
            description=entry["description"], created_at=entry["created_at"],
            created_by=entry["created_by"], tags=entry["tags"],
            fingerprint=entry["fingerprint"], compatibility_mode=doc["compatibility_mode"])

    @maps_errors()
    async def RegisterSchema(self, request, context):
        schema_id, version, is_new, fingerprint = await self.registry.register(
            request.subject, request.schema_type, request.schema_definition,
            request.description, request.created_by, list(request.tags))
        return sr.RegisterSchemaResponse(schema_id=schema_id, version=version,
                                         is_new_version=is_new, fingerprint=fingerprint)

    @maps_errors()
    async def GetSchema(self, request, context):
        doc = await self.registry.subject_of_id(request.schema_id)
        version = request.version if request.HasField("version") else None
        return self._schema_response(doc, self.registry.version_of(doc, version))

    @maps_errors()
    async def GetLatestSchema(self, request, context):
        doc = await self.registry.subject(request.subject)
        return self._schema_response(doc, self.registry.version_of(doc))

    @maps_errors()
    async def ListVersions(self, request, context):
        doc = await self.registry.subject(request.subject)
        return sr.ListVersionsResponse(versions=[
            sr.SchemaVersionInfo(version=v["version"], created_at=v["created_at"],
                                 created_by=v["created_by"], description=v["description"],
                                 fingerprint=v["fingerprint"], schema_id=doc["id"])
            for v in doc["versions"]])

    @maps_errors()
    async def CheckCompatibility(self, request, context):
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        ok, errors = await self.registry.check(request.subject, request.schema_type,
                                               request.new_schema_definition, mode)
        return sr.CheckCompatibilityResponse(is_compatible=ok, errors=errors)

    @maps_errors()
    async def DeleteSchemaVersion(self, request, context):
        await self.registry.delete_version(request.subject, request.version)
        return sr.DeleteSchemaVersionResponse(
            success=True, message=f"Deleted version {request.version} for subject "
                                  f"{request.subject}")

    @maps_errors()
    async def SetCompatibilityMode(self, request, context):
        mode = normalize_mode(request.compatibility_mode)
        await self.registry.set_mode(request.subject, mode)
        return sr.SetCompatibilityModeResponse(
            success=True, message=f"Set compatibility mode to {mode} for subject "
                                  f"{request.subject}")

    @maps_errors()
    async def ConfigureTopicSchema(self, request, context):
        message = await self.bindings.configure_topic_schema(
            request.topic_name, request.schema_subject, request.validation_policy,
            request.enable_payload_validation)
        return sr.ConfigureTopicSchemaResponse(success=True, message=message)

    @maps_errors()
    async def UpdateTopicValidationPolicy(self, request, context):
        message = await self.bindings.update_validation_policy(
            request.topic_name, request.validation_policy, request.enable_payload_validation)
        return sr.UpdateTopicValidationPolicyResponse(success=True, message=message)

    @maps_errors()
    async def GetTopicSchemaConfig(self, request, context):
        subject, policy, payloads, schema_id = await self.bindings.topic_schema_config(
            request.topic_name)
        return sr.GetTopicSchemaConfigResponse(schema_subject=subject, validation_policy=policy,
                                               enable_payload_validation=payloads,
                                               schema_id=schema_id)

    @maps_errors()
    async def ListSubjects(self, request, context):
        return sr.ListSubjectsResponse(subjects=[
            sr.SubjectSummary(subject=d["subject"], schema_type=d["versions"][-1]["schema_type"],
                              latest_version=d["versions"][-1]["version"],
                              compatibility_mode=d["compatibility_mode"], schema_id=d["id"],
                              tags=d["versions"][-1]["tags"])
            for d in await self.registry.subjects()])


def register(server, core):
    server.add_service(sr.DESCRIPTOR.services_by_name["SchemaRegistry"],
                       SchemaRegistryService(core))
