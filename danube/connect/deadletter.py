"""The dead-letter topic (``dead_letter_topic``): records that can never be delivered go
there with their payload and attributes unchanged, and the reason in ``dlq.*`` attributes.
Without a dead-letter topic such a record is logged and counted as failed, and dropped."""

import asyncio
import logging

from danube.client import errors as client_errors

log = logging.getLogger("danube.connect.deadletter")

# Attribute values travel in every message header: a reason is cut to this many characters.
MAX_REASON = 1000


class DeadLetters:
    def __init__(self, client, topic, connector_name, metrics, backoff, stopping):
        self.client = client
        self.topic = topic
        self.name = connector_name
        self.metrics = metrics
        self.backoff = backoff
        self.stopping = stopping            # () -> True once the stop deadline passed
        self._producer = None

    async def send(self, payload, attributes, key, reason, source_topic, **extra):
        """Publish one record to the dead-letter topic (retrying while the broker is
        unreachable) and return once the broker acknowledged it, or log it when there is
        none."""
        self.metrics.count(self.metrics.failed, source_topic)
        if self.topic is None:
            log.error("record dropped (no dead_letter_topic): %s", reason,
                      extra={"topic": source_topic, "reason": reason[:MAX_REASON]})
            return
        attrs = dict(attributes)
        attrs["dlq.reason"] = reason[:MAX_REASON]
        attrs["dlq.connector"] = self.name
        attrs["dlq.source_topic"] = source_topic
        for k, v in extra.items():
            attrs[f"dlq.{k}"] = str(v)
        attempt = 0
        while True:
            try:
                if self._producer is None:
                    self._producer = await self.client.create_producer(
                        self.topic, f"{self.name}-dlq", reliable=True)
                await self._producer.send(payload, attrs, key)
                break
            except (client_errors.InvalidArgument, client_errors.FailedPrecondition,
                    client_errors.ResourceExhausted) as exc:
                # The dead-letter topic refuses it too (e.g. larger than its limit): there
                # is nowhere left to put it.
                log.error("dead-letter topic %s refused a record (%s); dropped: %s",
                          self.topic, exc, reason, extra={"topic": source_topic})
                return
            except client_errors.DanubeError as exc:
                if self.stopping():
                    raise
                self.metrics.retry("broker")
                log.warning("dead-letter publish failed, retrying: %s", exc)
                await asyncio.sleep(self.backoff.delay(attempt))
                attempt += 1
        self.metrics.count(self.metrics.dead_lettered, source_topic)
        log.warning("record dead-lettered: %s", reason[:MAX_REASON],
                    extra={"topic": source_topic, "dead_letter_topic": self.topic})
