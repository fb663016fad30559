"""What a connector is: a ``SourceConnector`` (external system -> topics) or a
``SinkConnector`` (topics -> external system), a small class the runtime drives. The method
names are upstream danube-connect-core's (initialize, producer_configs / consumer_configs,
poll / process_batch, commit, shutdown, health_check).

A connector declares its configuration in ``CONFIG``: its own tables of ``Field``s (e.g.
``{"mqtt": Table({...})}``), read from the same TOML file as the core keys; the runtime
validates them before ``initialize`` and hands them over as ``self.config``. It is found by
name through the ``danube.connectors`` entry-point group (docs/connect.md shows one)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ProducerConfig:
    """A topic a source publishes to (upstream's ProducerConfig): ``partitions`` 0 for a
    plain topic, ``schema_subject`` to stamp its messages with the registry subject's
    latest version."""
    topic: str
    partitions: int = 0
    reliable_dispatch: bool = True
    schema_subject: str | None = None


@dataclasses.dataclass
class ConsumerConfig:
    """A topic a sink reads (upstream's ConsumerConfig). Exactly-once sinks need
    ``exclusive`` or ``failover``: one reader, offsets in order."""
    topic: str
    subscription: str
    subscription_type: str = "exclusive"
    consumer_name: str | None = None
    expected_schema_subject: str | None = None


class Connector:
    #: {"table": Table({...})}: the connector's own keys.
    CONFIG: dict = {}
    #: "source" or "sink".
    kind: str = ""

    def __init__(self, context):
        self.context = context
        self.config = context.config            # the connector's own namespace
        self.core = context.core                # the core keys
        self.log = context.log

    async def initialize(self):
        """Connect to the external system. Raise ``Unavailable`` if it cannot be reached:
        the runtime retries with backoff."""

    async def shutdown(self):
        """Release the external system (after the last commit)."""

    async def health_check(self):
        """None when the external system is usable, else a short reason."""
        return None


class SourceConnector(Connector):
    kind = "source"

    def producer_configs(self) -> list[ProducerConfig]:
        raise NotImplementedError

    async def poll(self, max_records: int):
        """Up to ``max_records`` SourceRecords, waiting up to ``processing.poll_interval_ms``
        for the first: ``[]`` when nothing came. Must be safe to cancel while it waits (take
        records only once there is nothing left to wait for)."""
        raise NotImplementedError

    async def commit(self, records):
        """``records`` (as poll returned them, in order, dead-lettered ones included) are
        acknowledged by the broker: acknowledge them to the external system."""


class SinkConnector(Connector):
    kind = "sink"

    # Set by the sink runtime (danube/connect/sink.py): what ``dead_letter`` calls.
    _send_dead_letters = None

    def consumer_configs(self) -> list[ConsumerConfig]:
        raise NotImplementedError

    async def committed_offsets(self) -> dict:
        """{partition topic: last offset already written}, for exactly-once sinks that keep
        their progress in the external system: the runtime skips (and acknowledges) every
        record at or below it, and below what the sink writes from then on. At-least-once
        sinks do not override it: a sink that does is taken to be the only reader of its
        partitions (an exclusive or failover subscription).

        Such a sink must send the records it refuses to ``dead_letter`` before the commit
        that carries their batch's offsets: once that commit is made, a restart skips them."""
        return {}

    def prepare(self, records):
        """Optional: the part of writing ``records`` that touches nothing outside (parsing,
        building columns). The runtime calls it for the next batch while the previous one is
        still being written, and hands what it returned to ``process_batch(records,
        prepared)``; None (the default) calls ``process_batch(records)``. It must not keep
        state that a failed write of the batch before would make wrong."""
        return None

    async def process_batch(self, records):
        """Write ``records`` (SinkRecords in topic order). Either all of them are written or
        an error is raised (``Unavailable``, ``RetryableError``, ``InvalidRecord`` naming a
        record, ``FatalError``). May return a list of ``InvalidRecord`` for records it left
        out, which go to the dead-letter topic (those it gave ``dead_letter`` already are
        not sent again)."""
        raise NotImplementedError

    async def dead_letter(self, rejected):
        """Send ``rejected`` (``InvalidRecord``s naming their records) to the dead-letter
        topic and return once the broker has acknowledged each (without a dead-letter topic:
        once each is logged and counted). An exactly-once sink calls it in
        ``process_batch`` before its commit, so that no record the commit skips on restart
        is missing from the dead-letter topic. A record is sent once per batch: the batch
        retried (``Unavailable``, a conflict) or returned in ``process_batch``'s list does
        not send it again. Raises what the publish raises once the runtime is stopping."""
        if rejected:
            await self._send_dead_letters(rejected)
