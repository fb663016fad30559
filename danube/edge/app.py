"""The edge process (`danube broker --mode edge`): the local topics' WALs, the MQTT listener,
the link to the cluster and one replicator per topic; stopped cleanly on SIGINT/SIGTERM.

All state is under the data directory: ``wal/{ns}/{topic}`` (the messages) and ``metadata``
(the embedded store: replication checkpoints and the schemas the cluster resolved, so an
edge restarted while the cluster is unreachable still validates and takes messages)."""

import asyncio
import logging
import os
import signal

from danube.edge.ingest import Ingest
from danube.edge.mqtt.server import MqttServer
from danube.edge.replicator import ClusterLink, TopicReplicator
from danube.edge.router import Router
from danube.metadata.embedded import EmbeddedStore
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.edge")


class EdgeBroker:
    def __init__(self, cfg, data_dir, token=None):
        self.cfg = cfg
        self.data_dir = data_dir
        self.token = token
        self.store = None
        self.ingest = None
        self.mqtt = None
        self.link = None
        self.replicators = []
        self._tasks = []

    async def start(self):
        cfg = self.cfg
        os.makedirs(self.data_dir, exist_ok=True)
        self.store = await EmbeddedStore.open(os.path.join(self.data_dir, "metadata"))
        self.ingest = Ingest(cfg, self.data_dir, self.store)
        await self.ingest.open()
        self.link = ClusterLink(cfg, self.ingest, self.token)
        self.replicators = [TopicReplicator(cfg, topic, self.link, self.store)
                            for topic in self.ingest.topics.values()]
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.link.run())]
        self._tasks += [loop.create_task(r.run()) for r in self.replicators]
        self.mqtt = MqttServer(cfg, Router(cfg.topic_mappings), self.ingest)
        host, port = cfg.listener_host_port
        port = await self.mqtt.start(host, port)
        log.info("edge ready: edge %s, MQTT listening on %s:%d, %d topics, replicating to %s",
                 cfg.edge_name, host, port, len(self.ingest.topics), cfg.cluster_url)

    async def stop(self):
        log.info("edge stopping")
        if self.mqtt is not None:
            await self.mqtt.stop()
        await cancel_and_wait(*self._tasks)
        if self.link is not None:
            await self.link.close()
        if self.ingest is not None:
            await self.ingest.close()
        if self.store is not None:
            await self.store.close()
        log.info("edge stopped")

    async def run(self):
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        await self.stop()
