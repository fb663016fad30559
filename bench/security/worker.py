"""Load for bench.security, one measurement per process, a JSON line on stdout.

    python -m bench.security.worker MODE --addr H:P [--ca PEM --token JWT] --duration S

MODE is `unary` (TopicLookup calls, --concurrency in flight on one connection: the
capacity), `latency` (one call at a time: the cost per call) or `publish` (--producers
reliable producers in one process, each sending 1000 x 100 B batches back to back through
danube_ext.BatchProducer: the batched durable publish rate)."""

import argparse
import asyncio
import json
import statistics
import sys
import time

from bench._proc import proc_cpu
from danube.proto import DanubeApi_pb2 as pb

LOOKUP = "/danube.Discovery/TopicLookup"
PAYLOAD = b"x" * 100
BATCH = 1000


async def _window(loop_body, workers, warmup, duration, broker_pid):
    """Run `workers` copies of loop_body(record) and count what completes in the window."""
    done, latencies, errors = [0], [], [0]
    window = [None, None]
    stop = False

    def record(n, seconds):
        now = time.perf_counter()
        if window[0] is not None and window[0] <= now and window[1] is None:
            done[0] += n
            latencies.append(seconds)

    async def worker():
        while not stop:
            try:
                await loop_body(record)
            except Exception as exc:  # noqa: BLE001 - counted, the first one shown
                if not errors[0]:
                    print(f"worker error: {exc}", file=sys.stderr)
                errors[0] += 1
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    await asyncio.sleep(warmup)
    cpu0, own0 = proc_cpu(broker_pid), time.process_time()
    window[0] = time.perf_counter()
    await asyncio.sleep(duration)
    window[1] = time.perf_counter()
    cpu1, own1 = proc_cpu(broker_pid), time.process_time()
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = window[1] - window[0]
    latencies.sort()
    return {"count": done[0], "per_s": done[0] / elapsed, "errors": errors[0],
            "p50_us": statistics.median(latencies) * 1e6 if latencies else None,
            "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6 if latencies else None,
            "broker_cpu": (cpu1 - cpu0) / elapsed, "client_cpu": (own1 - own0) / elapsed}


def _ssl(args):
    if not args.ca:
        return None
    from danube.rpc.client import client_ssl_context
    return client_ssl_context(ca_file=args.ca)


async def unary(args, concurrency):
    from danube.rpc.client import Channel

    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    channel = Channel(args.addr, ssl=_ssl(args), metadata=metadata)
    call = channel.unary_unary(LOOKUP, pb.TopicLookupRequest.SerializeToString,
                               pb.TopicLookupResponse.FromString)
    request = pb.TopicLookupRequest(request_id=1, topic=args.topic)
    await call(request, timeout=10)     # connects, and fails loudly if the topic is missing

    async def body(record):
        t = time.perf_counter()
        await call(request, timeout=10)
        record(1, time.perf_counter() - t)
    try:
        return await _window(body, concurrency, args.warmup, args.duration, args.broker_pid)
    finally:
        await channel.close()


async def publish(args):
    from danube.client import DanubeClient

    client = DanubeClient(("https://" if args.ca else "http://") + args.addr,
                          ssl=_ssl(args), token=args.token)
    producers = [await client.create_producer(args.topic, f"bench-{i}", reliable=True)
                 for i in range(args.producers)]
    payloads = [PAYLOAD] * BATCH
    free = list(producers)

    async def body(record):
        producer = free.pop()
        try:
            t = time.perf_counter()
            await producer.send_many(payloads, batch_size=BATCH)
            record(BATCH, time.perf_counter() - t)
        finally:
            free.append(producer)
    try:
        return await _window(body, args.producers, args.warmup, args.duration,
                             args.broker_pid)
    finally:
        await client.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("unary", "latency", "publish"))
    ap.add_argument("--addr", required=True)
    ap.add_argument("--broker-pid", type=int, required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--ca")
    ap.add_argument("--token")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--producers", type=int, default=4)
    args = ap.parse_args()
    import uvloop
    if args.mode == "publish":
        result = uvloop.run(publish(args))
    else:
        result = uvloop.run(unary(args, args.concurrency if args.mode == "unary" else 1))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
