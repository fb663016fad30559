"""Load for bench.cluster's publish section, one process, a JSON line on stdout:

    python -m bench.cluster.publish_worker --url http://H:P --topics /default/a,/default/b
        [--producers 2] [--duration 10] [--warmup 2]

--producers reliable producers per topic, each sending 1000 x 100 B batches back to back
through danube_ext.BatchProducer (our client, which follows a lookup's redirect to the
topic's owner). Counts the messages acknowledged within the window."""

import argparse
import asyncio
import json
import sys
import time

import uvloop

from danube.client import DanubeClient

PAYLOADS = [b"x" * 100] * 1000


async def run(args):
    client = DanubeClient(args.url)
    producers = [await client.create_producer(topic, f"bench-{i}", reliable=True)
                 for topic in args.topics.split(",") for i in range(args.producers)]
    window = [None, None]
    acked, errors, stop = [0], [0], False

    async def loop(producer):
        while not stop:
            try:
                await producer.send_many(PAYLOADS, batch_size=len(PAYLOADS))
            except Exception as exc:  # noqa: BLE001 - counted, the first one shown
                if not errors[0]:
                    print(f"publish error (the producer is created again): {exc}",
                          file=sys.stderr)
                errors[0] += 1
                await asyncio.sleep(0.05)
                # A topic moved to another broker (placement, rebalance): look it up again.
                try:
                    producer = await client.create_producer(
                        producer.topic, f"{producer.name}-{errors[0]}", reliable=True)
                except Exception:  # noqa: BLE001 - retried on the next round
                    pass
                continue
            now = time.perf_counter()
            if window[0] is not None and window[0] <= now and window[1] is None:
                acked[0] += len(PAYLOADS)

    tasks = [asyncio.create_task(loop(p)) for p in producers]
    await asyncio.sleep(args.warmup)
    window[0] = time.perf_counter()
    await asyncio.sleep(args.duration)
    window[1] = time.perf_counter()
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    return {"acked": acked[0], "seconds": window[1] - window[0], "errors": errors[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    args = ap.parse_args()
    sys.stdout.write(json.dumps(uvloop.run(run(args))) + "\n")


if __name__ == "__main__":
    main()
