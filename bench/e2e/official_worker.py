"""A producer or consumer process using the OFFICIAL Python client (`danube-client` 0.5.0,
import name `danube`) for the e2e benchmark. Run only by bench.e2e.runner, under the
official client's interpreter, isolated from this repository:

    <official python> -I bench/e2e/official_worker.py '<json config>'
    (no PYTHON* variables, working directory: a temporary directory)

Only this file's directory is put on sys.path (for `common`, standard library only); it
holds no `danube` package, and the import location of `danube` is checked. The official
client runs on the stock asyncio loop (grpc.aio); the process exits through os._exit so
lingering gRPC channels and health-check tasks cannot delay it.
"""

import asyncio
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import common  # noqa: E402

import danube  # noqa: E402  (the official client)
from danube import DanubeClientBuilder, SubType  # noqa: E402

if os.path.abspath(danube.__file__).startswith(os.path.join(REPO, "danube") + os.sep):
    raise SystemExit(f"imported this repository's danube ({danube.__file__}), "
                     "not danube-client")


class OfficialAdapter:
    def __init__(self, url):
        self.url = url
        self.client = None
        self.producer = self.consumer = None

    async def _client(self):
        if self.client is None:
            self.client = await DanubeClientBuilder().service_url(self.url).build()
        return self.client

    async def setup_producer(self, cfg):
        client = await self._client()
        self.producer = client.new_producer().with_topic(cfg["topic"]) \
            .with_name(cfg["name"]).build()      # NON_RELIABLE is the default
        await self.producer.create()
        self.send = self.producer.send

    async def send_many(self, payloads):
        raise NotImplementedError("the official client has no batch send")

    async def setup_consumer(self, cfg):
        client = await self._client()
        self.consumer = client.new_consumer().with_topic(cfg["topic"]) \
            .with_consumer_name(cfg["name"]).with_subscription(cfg["sub"]) \
            .with_subscription_type(SubType.EXCLUSIVE).build()
        await self.consumer.subscribe()
        queue = await self.consumer.receive()
        get = queue.get
        ack = self.consumer.ack if cfg.get("ack") else None

        async def payload():
            msg = await get()
            if ack is not None:
                await ack(msg)
            return msg.payload
        self.receive = payload

    async def close(self):
        if self.producer is not None:
            await self.producer.close()
        if self.consumer is not None:
            await self.consumer.close()


def main():
    cfg = json.loads(sys.argv[1])
    try:
        asyncio.run(common.worker(OfficialAdapter(cfg["url"]), cfg))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code not in (None, 0):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report everything
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
