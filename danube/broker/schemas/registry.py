"""The schema registry (danube_schema.SchemaRegistry's state): subjects, their versions and
compatibility modes, kept in the MetadataStore so that it survives restarts and works the
same on the embedded store and on etcd.

A subject is one document at ``keys.schema_metadata(subject)``, versions included, so that
every change is one compare-and-swap: two brokers (or two calls) registering at once cannot
both take version N, and the same schema registered twice at once yields one version. Ids:
one ``schema_id`` per subject, allocated once from the store-wide counter upstream uses
(``/schemas/_global/next_schema_id``) and indexed back to the subject.

Choices where upstream differs or is silent (docs/schema-registry.md):
- A new version is checked against every version the subject keeps, not only the latest
  (Confluent's *_TRANSITIVE modes): topics keep old messages, so a reader of the new
  schema meets data written under any of them.
- An incompatible schema fails with FAILED_PRECONDITION (upstream: INTERNAL); a malformed
  one with INVALID_ARGUMENT; an unknown subject, id or version with NOT_FOUND.
- Version numbers are never reused: after the latest is deleted, the next is one past it.
  Deleting a subject's last version deletes the subject (its id is not reused).
- Subject names are 1..256 bytes of UTF-8 without '/' (the key layout's separator).
"""

import asyncio
import json
import time

from danube.broker.errors import (InvalidArgument, SchemaIncompatible, SchemaNotFound,
                                  SchemaSubjectFull)
from danube.metadata import keys
from danube.schema._lru import LRU
from danube.schema.compat import check as compat_check
from danube.schema.formats import SchemaError, normalize_type, parse

MODES = ("none", "backward", "forward", "full")
DEFAULT_MODE = "backward"
MAX_SUBJECT_BYTES = 256
# A subject's versions live in one metadata record; etcd refuses a request over 1.5 MiB by
# default, so a subject stops growing well before that, whatever the store.
MAX_SUBJECT_RECORD_BYTES = 1024 * 1024
DEFINITIONS_KEPT = 4096
# How often a register/delete/set-mode retries when another writer changed the subject
# between its read and its compare-and-swap.
_CAS_ATTEMPTS = 64


def validate_subject(subject, field="subject"):
    if not subject:
        raise InvalidArgument(f"{field} is empty")
    if "/" in subject:
        raise InvalidArgument(f"{field} {subject!r} contains '/': subjects are plain names "
                              f"(the CLI derives /ns/topic's as ns-topic)")
    if len(subject.encode()) > MAX_SUBJECT_BYTES:
        raise InvalidArgument(f"{field} is longer than {MAX_SUBJECT_BYTES} bytes")
    if not subject.isprintable():
        # NUL cannot be in a metadata key, and no control character belongs in a name.
        raise InvalidArgument(f"{field} {subject!r} must not contain control characters")
    return subject


def normalize_mode(mode, field="compatibility_mode"):
    text = (mode or "").strip().lower()
    if text not in MODES:
        raise InvalidArgument(f"{field}: {mode!r} is not a compatibility mode (none, "
                              f"backward, forward, full)")
    return text


def _parse(schema_type, raw, field="schema_definition"):
    try:
        return parse(normalize_type(schema_type), bytes(raw))
    except SchemaError as exc:
        raise InvalidArgument(f"{field}: {exc}") from None


class SchemaRegistry:
    def __init__(self, store, clock=time.time):
        self.store = store
        self.clock = clock
        # fingerprint -> parsed Definition, bounded: deleted versions must not stay forever.
        self._definitions = LRU(DEFINITIONS_KEPT)
        # subject -> schema_id, and back: the publish path asks these on every message
        # whose topic validates, so they are kept here (ids never change once given).
        self._ids = {}
        self._subjects_by_id = {}

    # -- reading --------------------------------------------------------------------------

    async def subject(self, subject, field="subject"):
        """The subject's document, or SchemaNotFound (InvalidArgument, naming ``field``, for
        a name no subject can have)."""
        doc = await self.store.get(keys.schema_metadata(validate_subject(subject, field)))
        if doc is None or "versions" not in doc:       # absent, or being deleted
            raise SchemaNotFound(f"schema subject {subject!r} not found")
        self._remember(doc)
        return doc

    async def find_subject(self, subject, field="subject"):
        """The subject's document, or None."""
        try:
            return await self.subject(subject, field)
        except SchemaNotFound:
            return None

    async def subject_of_id(self, schema_id):
        name = self._subjects_by_id.get(schema_id)
        if name is None:
            entry = await self.store.get(keys.schema_by_id(schema_id))
            if entry is None:
                raise SchemaNotFound(f"schema id {schema_id} not found")
            name = entry["subject"]
        return await self.subject(name)

    async def schema_id_of(self, subject):
        if subject not in self._ids:
            await self.subject(subject)
        return self._ids[subject]

    def _remember(self, doc):
        self._ids[doc["subject"]] = doc["id"]
        self._subjects_by_id[doc["id"]] = doc["subject"]

    @staticmethod
    def version_of(doc, version=None):
        """The version entry ``version`` (latest when None) of a subject document."""
        versions = doc["versions"]
        if version is None:
            return versions[-1]
        for v in versions:
            if v["version"] == version:
                return v
        raise SchemaNotFound(f"version {version} of schema subject {doc['subject']!r} not "
                             f"found (versions: {', '.join(str(v['version']) for v in versions)})")

    def definition(self, entry):
        """The parsed Definition of a version entry (cached by fingerprint)."""
        fp = entry["fingerprint"]
        found = self._definitions.get(fp)
        if found is None:
            found = parse(entry["schema_type"], entry["raw"].encode())
            self._definitions.put(fp, found)
        return found

    async def subjects(self):
        docs = [doc for key, doc in await self.store.scan(keys.SCHEMAS + "/")
                if key.endswith("/metadata") and isinstance(doc, dict) and "versions" in doc]
        for doc in docs:
            self._remember(doc)
        return sorted(docs, key=lambda d: d["subject"])

    # -- compatibility --------------------------------------------------------------------

    def incompatibilities(self, doc, new, mode):
        """What keeps ``new`` (a Definition) from joining ``doc`` under ``mode``: one line
        per broken rule, each naming the version it breaks with."""
        if mode == "none":
            return []
        errors = []
        for entry in doc["versions"]:
            for problem in compat_check(self.definition(entry), new, mode):
                errors.append(f"version {entry['version']}: {problem}")
        return errors

    async def check(self, subject, schema_type, raw, mode=None):
        """CheckCompatibility: (is_compatible, errors). A subject without versions accepts
        anything of a valid type."""
        new = _parse(schema_type, raw, "new_schema_definition")
        doc = await self.subject(subject)
        mode = doc["compatibility_mode"] if mode is None else normalize_mode(mode)
        errors = self.incompatibilities(doc, new, mode)
        return not errors, errors

    # -- changing -------------------------------------------------------------------------

    async def register(self, subject, schema_type, raw, description="", created_by="",
                       tags=()):
        """RegisterSchema: (schema_id, version, is_new_version, fingerprint)."""
        validate_subject(subject)
        new = _parse(schema_type, raw)
        key = keys.schema_metadata(subject)
        for _ in range(_CAS_ATTEMPTS):
            entry = await self.store.get_entry(key)
            now = int(self.clock())
            if entry is None or "versions" not in entry.value:
                doc = {"id": None, "subject": subject, "compatibility_mode": DEFAULT_MODE,
                       "created_at": now, "created_by": created_by, "updated_at": now,
                       "latest_version": 0, "versions": []}
            else:
                doc = entry.value
                for v in doc["versions"]:
                    if v["fingerprint"] == new.fingerprint:
                        self._remember(doc)
                        return doc["id"], v["version"], False, v["fingerprint"]
                errors = self.incompatibilities(doc, new, doc["compatibility_mode"])
                if errors:
                    raise SchemaIncompatible(
                        f"schema is not compatible with subject {subject!r} (mode "
                        f"{doc['compatibility_mode']}): {'; '.join(errors)}")
            version = doc["latest_version"] + 1
            doc["versions"].append({
                "version": version, "schema_type": new.schema_type, "raw": new.raw,
                "fingerprint": new.fingerprint, "description": description,
                "created_by": created_by, "created_at": now, "tags": list(tags)})
            doc["latest_version"] = version
            doc["updated_at"] = now
            size = len(json.dumps(doc, separators=(",", ":")).encode())
            if size > MAX_SUBJECT_RECORD_BYTES:
                raise SchemaSubjectFull(
                    f"schema subject {subject!r} would hold {size} bytes with version "
                    f"{version} (at most {MAX_SUBJECT_RECORD_BYTES} bytes for a subject's "
                    f"versions): delete versions no longer used (DeleteSchemaVersion)")
            if doc["id"] is None:
                doc["id"] = await self.store.allocate_id(keys.SCHEMA_NEXT_ID)
            if await self.store.compare_and_swap(key, None if entry is None else entry.version,
                                                 doc):
                if version == 1:
                    await self.store.put(keys.schema_by_id(doc["id"]),
                                         {"schema_id": doc["id"], "subject": subject})
                self._definitions.put(new.fingerprint, new)
                self._remember(doc)
                return doc["id"], version, True, new.fingerprint
            # A new subject that lost the race leaves its allocated id unused: ids only have
            # to be unique and increasing, not dense.
            await asyncio.sleep(0)
        raise SchemaIncompatible(f"schema subject {subject!r} kept changing while it was "
                                 f"registered; try again")

    async def _update(self, subject, change):
        key = keys.schema_metadata(validate_subject(subject))
        for _ in range(_CAS_ATTEMPTS):
            entry = await self.store.get_entry(key)
            if entry is None or "versions" not in entry.value:
                raise SchemaNotFound(f"schema subject {subject!r} not found")
            doc = entry.value
            new = change(doc)
            if new is None:
                if await self._delete_subject(key, entry, doc):
                    return None
            elif await self.store.compare_and_swap(key, entry.version, new):
                return new
            await asyncio.sleep(0)
        raise SchemaIncompatible(f"schema subject {subject!r} kept changing; try again")

    async def _delete_subject(self, key, entry, doc):
        # The store has no conditional delete: mark it gone with a CAS first, so a register
        # racing with this sees a changed entry, then remove both keys.
        if not await self.store.compare_and_swap(key, entry.version, {"deleted": True}):
            return False
        await self.store.delete(keys.schema_by_id(doc["id"]))
        await self.store.delete(key)
        self._ids.pop(doc["subject"], None)
        self._subjects_by_id.pop(doc["id"], None)
        return True

    async def set_mode(self, subject, mode):
        mode = normalize_mode(mode)

        def change(doc):
            doc["compatibility_mode"] = mode
            doc["updated_at"] = int(self.clock())
            return doc
        await self._update(subject, change)
        return mode

    async def delete_version(self, subject, version):
        def change(doc):
            self.version_of(doc, version)          # SchemaNotFound
            doc["versions"] = [v for v in doc["versions"] if v["version"] != version]
            doc["updated_at"] = int(self.clock())
            return doc if doc["versions"] else None
        await self._update(subject, change)
