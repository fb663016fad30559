"""The sink runtime's dead letters and an exactly-once sink's commit (issue 51): the records
a sink hands to ``dead_letter`` are acknowledged by the broker before ``dead_letter``
returns, so before the commit that follows it; a record is sent once per batch however often
the batch is retried or returned again. In-process, over a fake runtime: the real broker and
sink processes are in tests/e2e/test_connect_{deltalake,iceberg,postgres_sink}.py."""

import types

from danube.connect import InvalidRecord, SinkConnector, SinkRecord, Unavailable
from danube.connect.sink import SinkRuntime


class Letters:
    """``rt.dead_letters``: what was sent, in order, with the log of events beside it."""

    def __init__(self, events):
        self.events = events

    async def send(self, payload, attributes, key, reason, source_topic, **extra):
        self.events.append(("dead letter", extra["offset"]))


class FakeRuntime:
    def __init__(self, events):
        self.core = types.SimpleNamespace(processing=types.SimpleNamespace(batch_size=10))
        self.dead_letters = Letters(events)
        self.health = types.SimpleNamespace(set=lambda *a: None)
        self.metrics = types.SimpleNamespace(count=lambda *a: None, processed="processed")
        self.backoff = types.SimpleNamespace(max_retries=3)

    async def external_failed(self, exc, attempt, forever, what=None):
        return attempt + 1


class CommittingSink(SinkConnector):
    """Refuses odd offsets; its "commit" fails ``outages`` times (Unavailable), then is
    logged with the batch's last offset."""

    def __init__(self, events, outages):
        self.events = events
        self.outages = outages

    async def committed_offsets(self):
        return {}

    async def process_batch(self, records):
        bad = [InvalidRecord("odd", r) for r in records if r.offset % 2]
        await self.dead_letter(bad)
        if self.outages:
            self.outages -= 1
            raise Unavailable("down")
        self.events.append(("commit", records[-1].offset))
        return bad


def record(offset):
    return SinkRecord("/default/t", "/default/t", offset, b"x", {}, None, 0, "p")


async def test_dead_letters_acknowledged_before_the_commit_and_sent_once():
    events = []
    sink = CommittingSink(events, outages=2)
    runtime = SinkRuntime(FakeRuntime(events), sink)
    assert runtime.exactly_once
    await runtime._process([record(i) for i in range(5)])
    # Sent once though the batch was tried three times and returned them again; the commit
    # (carrying offset 4) comes after the last of them.
    assert events == [("dead letter", 1), ("dead letter", 3), ("commit", 4)]

