"""An in-process broker with tiered storage for tests: the test's event loop runs it, so a
test can look at its catalogue and stats, and restart it on the same data directory."""

import asyncio
import time

import yaml

from danube.process.app import Broker
from danube.config import load_config
from danube.storage.durable.base import ObjectStore, ObjectStoreError


def tiered_tree(durable, *, interval=0.3, retention=True, extra=None):
    """A broker config tree: uploads every ``interval`` s and, with ``retention``, local
    retention that deletes every uploaded sealed segment within a second."""
    storage = {"mode": "object_store", "durable": dict(durable, upload_interval_seconds=interval)}
    if retention:
        storage["local_retention"] = {"time_minutes": 0, "check_interval_minutes": 0.005}
    tree = {"storage": storage, "dispatch": {"max_unacked_messages": 1000}}
    for key, value in (extra or {}).items():
        tree[key] = value
    return tree


class InProcBroker:
    def __init__(self, tmp_path, tree):
        self.tmp_path = tmp_path
        self.tree = tree
        self.data_dir = tmp_path / "data"
        self.broker = None

    async def start(self):
        path = self.tmp_path / "broker.yml"
        path.write_text(yaml.safe_dump(self.tree))
        cfg = load_config(str(path))
        cfg.data_dir = str(self.data_dir)
        cfg.client_port = cfg.admin_port = 0
        cfg.validate()
        self.broker = Broker(cfg)
        try:
            await self.broker.start()
        except BaseException:
            await self._cleanup()
            raise
        return self

    async def _cleanup(self):
        # A failed start leaves whatever it opened: close that so the next start can.
        core, store = self.broker.core, self.broker.store
        if core is not None:
            await core.stop()
        if store is not None:
            await store.close()

    async def stop(self):
        if self.broker is not None:
            await self.broker.stop()
            self.broker = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.broker.client_port}"

    @property
    def core(self):
        return self.broker.core

    @property
    def tiered(self):
        return self.broker.core.tiered

    def topic(self, name):
        """A loaded topic (after a restart a topic rests until used: ``await use(name)``)."""
        return self.core.topics[name]

    async def use(self, name):
        """The topic, loaded if it rests (what a client's first call does)."""
        return await self.core.topic_table.use(name)

    async def wait_uploaded(self, name, offset, timeout=60):
        """Until the durable tier holds ``offset`` of topic ``name``."""
        deadline = time.monotonic() + timeout
        while self.topic(name).log.tier.uploaded_end < offset:
            if time.monotonic() > deadline:
                tier = self.topic(name).log.tier
                raise AssertionError(f"{name}: uploaded up to {tier.uploaded_end}, waited for "
                                     f"{offset}; last error {tier.last_error}")
            await asyncio.sleep(0.05)

    async def wait_streaming(self, name, subscription, timeout=10):
        """Until every consumer of the subscription has its ReceiveMessages stream open (a
        consumer closed before that stays registered as active)."""
        deadline = time.monotonic() + timeout
        while not all(c.stream is not None
                      for c in self.topic(name).subscriptions[subscription].consumers.values()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}/{subscription}: no stream opened")
            await asyncio.sleep(0.02)

    async def wait_idle(self, name, subscription, timeout=10):
        """Until the subscription has no active consumer (a consumer's close reaches the
        broker when its stream ends), so nothing is delivered until the next one comes."""
        deadline = time.monotonic() + timeout
        while self.topic(name).subscriptions[subscription].active_consumers():
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}/{subscription} still has consumers")
            await asyncio.sleep(0.02)

    async def wait_local_first(self, name, offset, timeout=30):
        """Until local retention has deleted every offset below ``offset``."""
        deadline = time.monotonic() + timeout
        while self.topic(name).log.first_offset < offset:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}: local WAL still starts at "
                                     f"{self.topic(name).log.first_offset}")
            await asyncio.sleep(0.05)


async def upload_in_process(broker, store):
    """Make ``broker`` upload through ``store`` from its own process. Tests wrap the broker's
    store to count or fail its calls, which the upload child (s3, gcs, azblob and fs
    uploads) would not see; the child is stopped."""
    tiered = broker.tiered
    uploader, tiered._uploader = tiered._uploader, None
    if uploader is not None:
        await asyncio.to_thread(uploader.close)
    tiered.objstore = store


class FlakyStore(ObjectStore):
    """Wraps a store; while ``down`` every call fails as an unreachable server would (for
    backends with no server to stop)."""

    def __init__(self, inner):
        self.inner = inner
        self.backend = inner.backend
        self.keeps_files = inner.keeps_files
        self.down = False

    def _gate(self):
        if self.down:
            raise ObjectStoreError(f"{self.inner.describe()}: connection refused (test outage)")

    def describe(self):
        return self.inner.describe()

    def check(self):
        self._gate()
        return self.inner.check()

    def put(self, key, data, *, if_absent=False):
        self._gate()
        return self.inner.put(key, data, if_absent=if_absent)

    def put_file(self, key, path, size, *, if_absent=False):
        self._gate()
        return self.inner.put_file(key, path, size, if_absent=if_absent)

    def put_sealed_file(self, key, path, size, *, if_absent=False):
        self._gate()
        return self.inner.put_sealed_file(key, path, size, if_absent=if_absent)

    def get(self, key, start=0, end=None):
        self._gate()
        return self.inner.get(key, start, end)

    def head(self, key):
        self._gate()
        return self.inner.head(key)

    def list(self, prefix):
        self._gate()
        return self.inner.list(prefix)

    def delete(self, key):
        self._gate()
        return self.inner.delete(key)

    def close(self):
        return self.inner.close()
