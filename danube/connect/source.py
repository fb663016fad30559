"""The source runtime: poll the connector, publish each batch on the client's batched path,
and commit it back to the connector only once the broker acknowledged every record of it:
a crash before the commit makes the external system deliver the batch again (at least
once), never lose it."""

import asyncio
import itertools
import logging
import time

from danube.client import errors as client_errors
from danube.client.schema import register_schema, schema_reference
from danube.connect.connector import ProducerConfig
from danube.connect.errors import ConfigError, InvalidRecord, Unavailable

log = logging.getLogger("danube.connect.source")

# A record refused for what it is (the same record would be refused again): dead-lettered.
REFUSED = (client_errors.InvalidArgument, client_errors.FailedPrecondition,
           client_errors.ResourceExhausted, client_errors.PermissionDenied)


class Stopped(Exception):
    """The stop deadline passed with a batch unpublished: it is not committed, so the
    external system delivers it again after a restart."""


class SourceRuntime:
    def __init__(self, runtime, connector):
        self.rt = runtime
        self.connector = connector
        self.producers = {}
        self.configs = {}

    async def start(self):
        for cfg in self.connector.producer_configs():
            if not isinstance(cfg, ProducerConfig):
                raise ConfigError(f"producer_configs returned {cfg!r}, not a ProducerConfig")
            self.configs[cfg.topic] = cfg
        await self._register_schemas()
        for topic in self.configs:
            await self.rt.broker_retry(lambda t=topic: self._producer(t), f"producer on {topic}")

    async def _register_schemas(self):
        for mapping in self.rt.core.schemas:
            cfg = self.configs.get(mapping.topic)
            if cfg is None:
                log.warning("schema %s is for %s, which no route publishes to",
                            mapping.subject, mapping.topic)
                continue
            cfg.schema_subject = mapping.subject
            if not mapping.auto_register:
                continue
            if mapping.schema_type in ("json_schema", "avro"):
                if not mapping.schema_file:
                    raise ConfigError(f"schemas: {mapping.subject}: schema_type "
                                      f"{mapping.schema_type} needs schema_file")
                try:
                    with open(mapping.schema_file, "rb") as fh:
                        definition = fh.read()
                except OSError as exc:
                    raise ConfigError(f"schemas: {mapping.subject}: cannot read schema_file "
                                      f"{mapping.schema_file}: {exc.strerror}") from None
            else:
                definition = b""
            await self.rt.broker_retry(
                lambda m=mapping, d=definition: register_schema(
                    self.rt.client, m.subject, m.schema_type, d),
                f"schema {mapping.subject}")

    async def _producer(self, topic):
        producer = self.producers.get(topic)
        if producer is None:
            cfg = self.configs.get(topic) or ProducerConfig(topic)
            schema = schema_reference(cfg.schema_subject) if cfg.schema_subject else None
            producer = await self.rt.client.create_producer(
                topic, f"{self.rt.core.connector_name}", partitions=cfg.partitions or None,
                reliable=cfg.reliable_dispatch, schema=schema)
            self.producers[topic] = producer
        return producer

    async def run(self, stop):
        connector, rt = self.connector, self.rt
        batch_size = rt.core.processing.batch_size
        while not stop.is_set():
            poll = asyncio.ensure_future(connector.poll(batch_size))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait((poll, stopper), return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not poll.done():
                poll.cancel()
                await asyncio.gather(poll, return_exceptions=True)
                break
            records = poll.result()
            if not records:
                continue
            await self._deliver(records)

    async def _deliver(self, records):
        rt = self.rt
        started = time.perf_counter()
        rt.metrics.inflight.labels(rt.name).set(len(records))
        rt.metrics.batch_size.labels(rt.name).observe(len(records))
        for topic, group in itertools.groupby(records, key=lambda r: r.topic):
            group = list(group)
            rt.metrics.count(rt.metrics.received, topic, len(group))
            await self._publish(topic, group)
        await rt.external_retry(lambda: self.connector.commit(records), "commit")
        rt.metrics.inflight.labels(rt.name).set(0)
        rt.metrics.lag.labels(rt.name).set(0)
        rt.metrics.batch_latency.labels(rt.name).observe(time.perf_counter() - started)

    async def _publish(self, topic, records):
        """Publish ``records`` in order; on a refusal, find the refused records one by one
        and dead-letter them; while the broker is unreachable, retry with backoff."""
        rt = self.rt
        pending = list(records)
        attempt = 0
        while pending:
            try:
                producer = await self._producer(topic)
                pending = await self._send_runs(producer, pending)
                rt.health.set("broker")
            except REFUSED:
                pending = await self._send_one_by_one(topic, pending)
            except client_errors.DanubeError as exc:
                # A restarted broker no longer knows the producer (NOT_FOUND), and a
                # moved topic is elsewhere: the next try creates it again (same name).
                stale = self.producers.pop(topic, None)
                if stale is not None:
                    await stale.close()
                attempt = await rt.broker_failed(exc, attempt)
        rt.metrics.count(rt.metrics.processed, topic, len(records))

    async def _send_runs(self, producer, records):
        """Send the records in batched calls, each with its own key and attributes (records
        from interleaved MQTT topics each carry their own `mqtt.topic`: one call for all of
        them, not one per change of attributes); returns [] once all are acknowledged, or
        raises the failure with what was acknowledged removed from ``records``."""
        payloads = [r.payload_bytes() for r in records]
        done = 0

        def count(_index, result):
            nonlocal done
            if not isinstance(result, BaseException):
                done += 1
        try:
            await producer.send_many(payloads, keys=[r.key for r in records],
                                     attributes_each=[r.attributes or None for r in records],
                                     on_result=count)
        except client_errors.DanubeError:
            # Only a whole batch is ever acknowledged, and in order for one partition:
            # what was acknowledged is not sent again.
            del records[:done if producer.partitions is None else 0]
            raise
        return []

    async def _send_one_by_one(self, topic, records):
        rt = self.rt
        producer = await self._producer(topic)
        for index, record in enumerate(records):
            try:
                await producer.send(record.payload_bytes(), record.attributes or None,
                                    record.key)
            except REFUSED as exc:
                record.rejected = str(exc)
                await rt.dead_letters.send(record.payload_bytes(), record.attributes,
                                           record.key, str(exc), topic)
            except client_errors.DanubeError:
                return records[index:]
        return []
