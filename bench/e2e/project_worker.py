"""A producer or consumer process using this project's client library (danube.client) on
uvloop, for the e2e benchmark. Run only by bench.e2e.runner:

    python -P -m bench.e2e.project_worker '<json config>'     (PYTHONPATH=<repo>)
"""

import json
import sys

import uvloop

from bench.e2e import common
from danube.client import DanubeClient


class ProjectAdapter:
    def __init__(self, url):
        self.client = DanubeClient(url)
        self.producer = self.consumer = None
        self.batch_size = 1000

    async def setup_producer(self, cfg):
        self.producer = await self.client.create_producer(cfg["topic"], cfg["name"])
        self.batch_size = cfg.get("batch", 1000)
        self.send = self.producer.send

    async def send_many(self, payloads):
        await self.producer.send_many(payloads, batch_size=self.batch_size)

    async def setup_consumer(self, cfg):
        self.consumer = await self.client.subscribe(cfg["topic"], cfg["name"], cfg["sub"],
                                                    sub_type="exclusive")
        receive = self.consumer.receive

        async def payload():
            return (await receive()).payload
        self.receive = payload

    async def close(self):
        await self.client.close()


def main():
    cfg = json.loads(sys.argv[1])
    uvloop.run(common.worker(ProjectAdapter(cfg["url"]), cfg))


if __name__ == "__main__":
    main()
