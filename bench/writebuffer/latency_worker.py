"""Unbatched send() ack latency, one process, a JSON line on stdout:

    python -m bench.writebuffer.latency_worker --url http://H:P --topic /default/t [--n 2000]

One reliable producer (our client) sends 100 B messages one at a time, each awaited."""

import argparse
import json
import sys
import time

import uvloop

from danube.client import DanubeClient


async def run(args):
    client = DanubeClient(args.url)
    producer = await client.create_producer(args.topic, "lat", reliable=True)
    for _ in range(100):
        await producer.send(b"w" * 100)
    samples = []
    for _ in range(args.n):
        t = time.perf_counter()
        await producer.send(b"x" * 100)
        samples.append((time.perf_counter() - t) * 1e6)
    await client.close()
    samples.sort()
    return {"n": len(samples), "p50_us": samples[len(samples) // 2],
            "p99_us": samples[int(len(samples) * 0.99)]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    sys.stdout.write(json.dumps(uvloop.run(run(args))) + "\n")


if __name__ == "__main__":
    main()
