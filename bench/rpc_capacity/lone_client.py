"""Load for bench.rpc_capacity's "lone" section: grpcio (grpc.aio) clients, each connection
with one unary call in flight at a time, as an official client's acks and sends arrive.

    python -m bench.rpc_capacity.lone_client --port P --connections 50 \\
        --start-at T0 --end-at T1

Opens `connections` channels (a subchannel pool of their own each, so each is its own TCP
connection), each calling /bench.Bench/Unary with a 100-byte payload in a loop, and counts
the calls that completed inside the wall-clock window [T0, T1) (time.time()). Checks every
answer is the echo of its request. Prints one JSON line: calls, errors, wrong, connections.
"""

import argparse
import asyncio
import json
import os
import time

import grpc


async def run(args):
    payload = b"x" * 100
    channels = [grpc.aio.insecure_channel(
        f"127.0.0.1:{args.port}",
        options=[("grpc.use_local_subchannel_pool", 1), ("bench.channel", i)])
        for i in range(args.connections)]
    counts = {"calls": 0, "errors": 0, "wrong": 0}

    async def one(channel, i):
        call = channel.unary_unary("/bench.Bench/Unary")
        body = payload[:-8] + i.to_bytes(8, "big")     # each connection's own answer
        while True:
            now = time.time()
            if now >= args.end_at:
                return
            try:
                answer = await call(body, timeout=30)
            except grpc.aio.AioRpcError:
                counts["errors"] += 1
                await asyncio.sleep(0.01)
                continue
            if args.start_at <= now and time.time() < args.end_at:
                counts["calls"] += 1
                if answer != body:
                    counts["wrong"] += 1

    try:
        await asyncio.gather(*(ch.channel_ready() for ch in channels))
        await asyncio.gather(*(one(ch, i) for i, ch in enumerate(channels)))
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    counts["connections"] = args.connections
    counts["pid"] = os.getpid()
    print(json.dumps(counts), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--start-at", type=float, required=True)
    ap.add_argument("--end-at", type=float, required=True)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
