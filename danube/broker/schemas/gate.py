"""A topic's schema binding, applied on its publish path: the subject it is bound to, the
validation policy (none, warn, enforce) and whether payloads are validated too.

With warn or enforce every message must carry the subject's schema_id (schema_id names a
subject, reference a.2); a schema_version, when present, must be one the subject keeps. With
payload validation the payload must match that version (the latest when the message names
none; upstream falls back to version 1 there). Enforce refuses the publish with
PERMISSION_DENIED naming what failed (a batch is refused whole: nothing of it is stored);
warn logs (at most once a second per topic) and counts, and the message goes on.

A batch (danube_ext.BatchProducer) is checked without a Python object per message for the
ids (``MessageBatchView.schema_mismatch``, in C); payloads are validated per version with
the registry's compiled validators (``check_many``)."""

import logging
import time

from danube.broker.errors import SchemaNotFound, SchemaRejected
from danube.schema.validate import PayloadInvalid, validator_for

log = logging.getLogger("danube.schema")

POLICIES = ("none", "warn", "enforce")
# A version the subject lacked is looked up again at most this often (seconds), and at most
# this many such versions are remembered.
ABSENT_RETRY = 1.0
MAX_ABSENT = 1024
# How the topic's config key spells them (keys.topic_schema_config), as upstream's serde does.
STORED_POLICY = {"none": "None", "warn": "Warn", "enforce": "Enforce"}


class SchemaGate:
    def __init__(self, registry, topic_name, subject, policy="none", payloads=False):
        self.registry = registry
        self.topic_name = topic_name
        self.subject = subject
        self.policy = policy
        self.payloads = payloads
        self.schema_id = None
        self._doc = None               # the subject's document, as last read
        # version -> when a re-read of the subject last failed to find it: a producer
        # stamping a version that does not exist must not cost a metadata read per message.
        self._absent = {}
        self.checked = 0
        self.failures = {}             # reason -> count
        self._last_warning = 0.0

    @property
    def active(self):
        return self.policy != "none"

    def config(self):
        return {"subject": self.subject, "validation_policy": STORED_POLICY[self.policy],
                "enable_payload_validation": self.payloads}

    async def _subject_doc(self, refresh=False):
        if self._doc is None or refresh:
            self._doc = await self.registry.subject(self.subject)
            self.schema_id = self._doc["id"]
        return self._doc

    async def _entry(self, version):
        """The subject's version entry (latest for 0), re-reading the subject for a version
        registered since the last read (at most once per ABSENT_RETRY per version); None if
        the subject has no such version."""
        doc = await self._subject_doc()
        try:
            return self.registry.version_of(doc, version or None)
        except SchemaNotFound:
            pass
        now = time.monotonic()
        last = self._absent.get(version)
        if last is not None and now - last < ABSENT_RETRY:
            return None
        doc = await self._subject_doc(refresh=True)
        try:
            entry = self.registry.version_of(doc, version or None)
        except SchemaNotFound:
            if len(self._absent) >= MAX_ABSENT:
                self._absent.clear()
            self._absent[version] = now
            return None
        self._absent.pop(version, None)
        return entry

    # -- checks ---------------------------------------------------------------------------

    async def check_message(self, msg):
        self.checked += 1
        try:
            await self._subject_doc()
        except SchemaNotFound:
            return self._fail("subject_missing", f"schema subject {self.subject!r} of topic "
                              f"{self.topic_name} is no longer registered")
        if not msg.HasField("schema_id"):
            return self._fail("missing_schema_id", f"message has no schema_id; topic "
                              f"{self.topic_name} requires subject {self.subject!r} (schema_id "
                              f"{self.schema_id})")
        if msg.schema_id != self.schema_id:
            return self._fail("subject_mismatch", self._mismatch(msg.schema_id))
        version = msg.schema_version if msg.HasField("schema_version") else 0
        entry = await self._entry(version)
        if entry is None:
            return self._fail("unknown_version", self._unknown_version(version))
        if self.payloads:
            try:
                validator_for(self.registry.definition(entry)).check(msg.payload)
            except PayloadInvalid as exc:
                return self._fail("payload_invalid", f"payload does not match version "
                                  f"{entry['version']} of {self.subject!r}: {exc}")
        return None

    async def check_batch(self, batch):
        self.checked += len(batch)
        try:
            await self._subject_doc()
        except SchemaNotFound:
            return self._fail("subject_missing", f"schema subject {self.subject!r} of topic "
                              f"{self.topic_name} is no longer registered")
        index, found = batch.schema_mismatch(self.schema_id)
        if index >= 0:
            if found is None:
                return self._fail("missing_schema_id", f"message {index} of the batch has no "
                                  f"schema_id; topic {self.topic_name} requires subject "
                                  f"{self.subject!r} (schema_id {self.schema_id})")
            return self._fail("subject_mismatch", f"message {index} of the batch: "
                              f"{self._mismatch(found)}")
        if not self.payloads:
            # Only the versions matter: no Python object per message.
            for version in batch.distinct_versions():
                if await self._entry(version) is None:
                    index = batch.payloads_and_versions(False)[1].index(version)
                    return self._fail("unknown_version", f"message {index} of the batch: "
                                      f"{self._unknown_version(version)}")
            return None
        payloads, versions = batch.payloads_and_versions()
        by_version = {}
        for i, version in enumerate(versions):
            by_version.setdefault(version, []).append(i)
        for version, indices in by_version.items():
            entry = await self._entry(version)
            if entry is None:
                return self._fail("unknown_version", f"message {indices[0]} of the batch: "
                                  f"{self._unknown_version(version)}")
            validator = validator_for(self.registry.definition(entry))
            group = payloads if len(indices) == len(payloads) else [payloads[i] for i in indices]
            bad = validator.check_many(group)
            if bad is not None:
                try:
                    validator.check(group[bad])
                    reason = "invalid"
                except PayloadInvalid as exc:
                    reason = str(exc)
                return self._fail("payload_invalid", f"message {indices[bad]} of the batch: "
                                  f"payload does not match version {entry['version']} of "
                                  f"{self.subject!r}: {reason}")
        return None

    def _mismatch(self, schema_id):
        return (f"schema_id {schema_id} is not that of subject {self.subject!r} "
                f"({self.schema_id}), which topic {self.topic_name} requires")

    def _unknown_version(self, version):
        return (f"schema_version {version} is not a version of subject {self.subject!r} "
                f"(latest {self._doc['latest_version']})")

    def _fail(self, reason, message):
        self.failures[reason] = self.failures.get(reason, 0) + 1
        if self.policy == "enforce":
            raise SchemaRejected(f"schema validation failed on {self.topic_name}: {message}")
        now = time.monotonic()
        if now - self._last_warning >= 1.0:
            self._last_warning = now
            log.warning("schema validation (warn) on %s: %s", self.topic_name, message)
        return reason
