"""The hand-picked mutants of the critical modules, each with the tests that must kill it
(tests/mutation/run.py, docs/testing.md). `original` must occur exactly once in the file
(relative to the danube package), so that a change to the code is noticed here. Only Python
modules: a mutant of a .pyx would need a compile per mutant."""

import collections

Mutant = collections.namedtuple("Mutant", "name file original replacement tests what")

PC = "tests/e2e/test_power_cut.py"
ALWAYS = f"{PC}::test_always_every_acknowledged_message_survives_power_cuts"
CURSOR = f"{PC}::test_durable_ack_ranges_survive_a_power_cut"
ORDER = "tests/e2e/test_power_cut_order.py"
DENY = "tests/unit/test_security_default_deny.py"
SCHEMA = "tests/e2e/test_schema_registry.py"

MUTANTS = [
    # WAL append and sync
    Mutant("publish-without-sync", "broker/topic.py",
           "                await log.sync_to(last)\n",
           "                pass\n",
           [ALWAYS],
           "a reliable publish in mode always is acknowledged without waiting for its sync"),
    Mutant("sync-without-fdatasync", "storage/wal/group_commit.py",
           "        else:\n            _fdatasync(fd)\n",
           "        else:\n            pass\n",
           [ALWAYS],
           "the WAL's sync job skips the fdatasync of the segments it holds open"),
    Mutant("wal-dir-synced-last", "storage/wal/group_commit.py",
           "                job.after_dir = sum(seg in new for seg, _, _ in job.sync)\n",
           "                job.after_dir = 0\n",
           [f"{ORDER}::test_what_a_returned_sync_covered_survives"],
           "the sync job makes new segments' directory entries durable after their data"),
    Mutant("empty-tail-kept", "storage/recovery.py",
           "        empty = _empty_tail(directory, found)\n",
           "        empty = len(found)\n",
           [f"{ORDER}::test_a_cut_around_the_directory_s_sync_leaves_a_prefix"],
           "recovery keeps the empty segments a power cut after rotations can leave"),
    Mutant("wal-dir-not-durable", "storage/recovery.py",
           "    makedirs_durable(directory)\n",
           "    os.makedirs(directory, exist_ok=True)\n",
           [ALWAYS],
           "a topic's new WAL directory is created without syncing its parents"),
    # Cursor persistence (and the metadata store under it)
    Mutant("durable-ack-not-flushed", "services/batch_consumer.py",
           "            await dispatcher.flush_cursor()\n",
           "            pass\n",
           [CURSOR],
           "AckRanges(durable) answers before the subscription's progress is stored"),
    Mutant("acks-above-cursor-not-saved", "broker/cursor.py",
           "                    await self._on_acked(_window.to_ranges(acked))\n",
           "                    pass\n",
           [CURSOR, "tests/unit/test_ack_ranges.py::test_out_of_order_acks_survive_a_restart"],
           "the offsets acknowledged above the cursor are not persisted"),
    Mutant("metadata-commit-not-synced", "metadata/_writer.py",
           '            self._set_level(conn, "FULL" if durable else "NORMAL")\n',
           '            self._set_level(conn, "NORMAL")\n',
           [CURSOR],
           "the embedded store commits durable writes without an fsync (synchronous=NORMAL)"),
    # Ack ranges
    Mutant("ack-ranges-cursor-kept", "broker/reliable.py",
           "        self.cursor = cursor\n        if count:\n",
           "        if count:\n",
           ["tests/unit/test_ack_ranges.py"],
           "AckRanges acknowledges the messages but does not move the cursor"),
    # RBAC guard
    Mutant("no-default-deny", "security/guard.py",
           '            self.authorize(principal, f"call {context.method.name}", CLUSTER)\n',
           "            pass\n",
           [DENY],
           "a method without a permission row is open to every authenticated principal"),
    Mutant("guard-allows-all", "security/guard.py",
           "        if self.rbac.grant(principal, permission, resource) is not None:\n",
           "        if True:\n",
           [DENY],
           "the guard allows a call whatever the principal's bindings"),
    Mutant("super-admin-is-anyone", "security/rbac.py",
           '        if principal.type == "broker_internal" or principal.name in '
           'self.super_admins:\n',
           '        if principal.type == "broker_internal" or principal.name:\n',
           ["tests/unit/test_security.py::test_decision_across_scopes"],
           "every principal is treated as a super admin"),
    # Schema gate
    Mutant("schema-id-unchecked", "broker/schemas/gate.py",
           "        if msg.schema_id != self.schema_id:\n",
           "        if False:\n",
           [f"{SCHEMA}::test_another_subjects_schema_id_is_refused_in_enforce"],
           "a message carrying another subject's schema_id passes an enforce gate"),
    Mutant("payload-unvalidated", "broker/schemas/gate.py",
           "                validator_for(self.registry.definition(entry)).check(msg.payload)\n",
           "                pass\n",
           [f"{SCHEMA}::test_enforce_with_payload_validation"],
           "payload validation is skipped for single messages"),
    Mutant("enforce-only-warns", "broker/schemas/gate.py",
           '        if self.policy == "enforce":\n',
           '        if self.policy == "never":\n',
           [f"{SCHEMA}::test_unknown_version_is_refused_in_enforce"],
           "policy enforce only warns"),
    # Cluster fencing
    Mutant("fence-too-late", "cluster/membership.py",
           "FENCE_FRACTION = 0.75\n",
           "FENCE_FRACTION = 3.0\n",
           ["tests/e2e/test_cluster_resilience.py::"
            "test_broker_cut_off_from_etcd_stops_serving_before_its_topic_moves"],
           "a broker cut off from etcd keeps serving past its lease"),
]
