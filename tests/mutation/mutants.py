"""The hand-picked mutants of the critical modules, each with the tests that must kill it
(tests/mutation/run.py, docs/testing.md). `original` must occur exactly once in the file
(relative to the danube package), so that a change to the code is noticed here. Only Python
modules: a mutant of a .pyx would need a compile per mutant."""

import collections

Mutant = collections.namedtuple("Mutant", "name file original replacement tests what")

PC = "tests/e2e/test_power_cut.py"
ALWAYS = f"{PC}::test_always_every_acknowledged_message_survives_power_cuts[journal]"
OWN_SYNCS = f"{PC}::test_always_every_acknowledged_message_survives_power_cuts[own-syncs]"
JOURNAL = "tests/e2e/test_journal_power_cut.py"
CURSOR = f"{PC}::test_durable_ack_ranges_survive_a_power_cut"
ORDER = "tests/e2e/test_power_cut_order.py"
DENY = "tests/unit/test_security_default_deny.py"
SCHEMA = "tests/e2e/test_schema_registry.py"
WB = "tests/unit/test_write_buffer.py"
DELTA_KILLS = "tests/e2e/test_connect_deltalake.py::test_three_sigkills_exactly_once"

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
           [OWN_SYNCS],
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
           "        makedirs_durable(directory)\n",
           "        os.makedirs(directory, exist_ok=True)\n",
           [OWN_SYNCS],
           "a topic's new WAL directory is created without syncing its parents"),
    # The broker's journal (mode always, the default)
    Mutant("journal-without-fdatasync", "storage/journal/journal.py",
           "        _fdatasync(self._fd)\n        self._pos = pos\n",
           "        self._pos = pos\n",
           [ALWAYS],
           "a journal commit acknowledges its group without the fdatasync"),
    Mutant("journal-trim-without-syncfs", "storage/journal/journal.py",
           "            sync_filesystem(self.root)\n        except OSError as exc:\n",
           "            pass\n        except OSError as exc:\n",
           [f"{JOURNAL}::test_every_acknowledged_message_of_every_topic_survives_rolls_trims_"
            "and_cuts"],
           "a closed journal file is recycled before the file system is synced behind it"),
    Mutant("journal-dir-not-durable", "storage/journal/journal.py",
           "    makedirs_durable(directory)         # (its files' entries are synced",
           "    os.makedirs(directory, exist_ok=True)  # (its files' entries are synced",
           [ALWAYS],
           "the journal's directory is created without syncing its parents"),
    Mutant("deleted-topic-not-forgotten", "storage/logs.py",
           "            await self.journal.forget(self.directory(name))\n",
           "            pass\n",
           [f"{JOURNAL}::test_a_deleted_topic_does_not_come_back_from_the_journal"],
           "a topic's WAL is deleted with no FORGET record before it: a replay brings it back"),
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
    # The write buffer's rebuild of a topic's log
    Mutant("stale-wal-kept-with-a-tier", "storage/writebuffer/rebuild.py",
           "            if last == end and (bounds is None or end < bounds[0]\n",
           "            if True or (bounds is None or end < bounds[0]\n",
           [f"{WB}::test_a_stale_local_wal_is_set_aside_for_the_stream"],
           "with a durable tier, a former owner's local WAL is kept whatever it holds"),
    Mutant("short-wal-not-extended", "storage/writebuffer/rebuild.py",
           "                n = await _replay(name, wal, reader, key, bounds[1])\n",
           "                n = 0\n",
           [f"{WB}::test_without_a_tier_a_short_local_wal_is_extended_from_the_stream"],
           "without a durable tier, a local WAL short of the stream is not extended from it"),
    # Delta Lake sink: exactly once across kills
    Mutant("delta-commit-without-offset", "connectors/deltalake.py",
           "            txns = [Transaction(self.app_id(route, p), v) for p, v in last.items()]\n",
           "            txns = []\n",
           [DELTA_KILLS],
           "the Delta commit does not carry the batch's offsets"),
    Mutant("delta-offsets-not-read-back", "connectors/deltalake.py",
           "                    out[partition] = version\n",
           "                    pass\n",
           [DELTA_KILLS],
           "the restarted Delta sink does not read its committed offsets back"),
    # The edge's acks
    Mutant("edge-puback-before-sync", "edge/mqtt/session.py",
           "                for wal, offset in needed.items():\n"
           "                    if wal.durable_offset < offset:\n"
           "                        await wal.sync_to(offset)\n"
           "                done = 0\n"
           "                out = []\n"
           "                for wal, offset, ack, acks in self._unacked:\n"
           "                    if wal is not None and wal.durable_offset < offset:\n",
           "                for wal, offset in needed.items():\n"
           "                    if wal.durable_offset < offset:\n"
           "                        asyncio.ensure_future(wal.sync_to(offset))\n"
           "                done = 0\n"
           "                out = []\n"
           "                for wal, offset, ack, acks in self._unacked:\n"
           "                    if False:\n",
           ["tests/e2e/test_edge_power_cut.py"],
           "the edge sends PUBACK/PUBREC before the WAL's sync covers the message"),
    Mutant("edge-replicator-without-broker-url", "edge/replicator.py",
           "                    pb.ReplicateAck.FromString)(metadata=metadata)\n",
           "                    pb.ReplicateAck.FromString)()\n",
           ["tests/e2e/test_edge_cluster_mode.py::"
            "test_through_an_ingress_each_stream_goes_to_the_owner"],
           "the edge's ReplicateData streams carry no x-danube-broker-url (an ingress in "
           "proxy mode sends them to any broker)"),
    # Flow control of a server stream (TopicHistory.ReadRange's slow reader)
    Mutant("stream-write-ignores-window", "rpc/server_stream.py",
           "        if not self.send_data(self._frame(data)) or self.conn.write_paused:\n"
           "            await self.drain()\n",
           "        self.send_data(self._frame(data))\n",
           ["tests/e2e/test_topic_history.py::"
            "test_a_slow_reader_holds_the_stream_and_cancelling_closes_the_reader"],
           "a streaming response's write does not wait for the client's window"),
    # Cluster fencing
    Mutant("fence-too-late", "cluster/membership.py",
           "FENCE_FRACTION = 0.75\n",
           "FENCE_FRACTION = 3.0\n",
           ["tests/e2e/test_cluster_resilience.py::"
            "test_broker_cut_off_from_etcd_stops_serving_before_its_topic_moves"],
           "a broker cut off from etcd keeps serving past its lease"),
]
