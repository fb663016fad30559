"""Idle-stream cost load client for bench.rpc_capacity (our Channel on uvloop).

    python -m bench.rpc_capacity.load_client --port P --server-pid PID --duration 10

On ONE connection: measure unary throughput with `--concurrency` calls in flight, then open
`--streams` Hang calls (server-streaming calls that never send anything) on the same
connection, wait until the server reports them all running, and measure again. Server CPU
(utime+stime of --server-pid from /proc) and this process's CPU are sampled over each
measurement window. Prints one JSON object on stdout.
"""

import argparse
import asyncio
import json
import sys
import time

from bench._proc import proc_cpu, system_busy

PAYLOAD = b"x" * 100


async def measure(unary, server_pid, duration, warmup, concurrency):
    count = 0
    errors = 0
    stop = False

    async def worker():
        nonlocal count, errors
        while not stop:
            try:
                await unary(PAYLOAD)
            except Exception:  # noqa: BLE001 - counted and reported
                errors += 1
                await asyncio.sleep(0.01)
            else:
                count += 1

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.sleep(warmup)
        c0, e0 = count, errors
        t0, s0, p0, b0 = (time.perf_counter(), proc_cpu(server_pid), time.process_time(),
                          system_busy())
        await asyncio.sleep(duration)
        c1, e1 = count, errors
        t1, s1, p1, b1 = (time.perf_counter(), proc_cpu(server_pid), time.process_time(),
                          system_busy())
    finally:
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = t1 - t0
    calls = c1 - c0
    return {
        "calls": calls,
        "errors": e1 - e0,
        "elapsed_s": elapsed,
        "calls_per_s": calls / elapsed,
        "server_cpu_s": s1 - s0,
        "server_cpu_util": (s1 - s0) / elapsed,
        "server_cpu_us_per_call": (s1 - s0) / calls * 1e6 if calls else None,
        "client_cpu_s": p1 - p0,
        "client_cpu_util": (p1 - p0) / elapsed,
        "other_cpu_util": max(0.0, ((b1 - b0) - (s1 - s0) - (p1 - p0)) / elapsed),
    }


async def open_streams_info(channel):
    return json.loads(await channel.unary_unary("/bench.Bench/OpenStreams")(b"", timeout=10))


async def main_async(args):
    from danube.rpc.client import Channel

    channel = Channel(f"127.0.0.1:{args.port}")
    unary = channel.unary_unary("/bench.Bench/Unary")
    await unary(PAYLOAD, timeout=10)  # connect
    conn = await channel.connection()
    result = {"concurrency": args.concurrency, "streams": args.streams,
              "duration_s": args.duration, "warmup_s": args.warmup}

    result["baseline"] = await measure(unary, args.server_pid, args.duration, args.warmup,
                                       args.concurrency)

    hang = channel.unary_stream("/bench.Bench/Hang")
    calls = []
    t0 = time.perf_counter()
    for _ in range(args.streams):
        calls.append(await hang(b""))
    deadline = time.monotonic() + 60
    while True:
        info = await open_streams_info(channel)
        if info["hang"] >= args.streams or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    result["open_s"] = time.perf_counter() - t0
    result["server_before"] = info
    if conn is not await channel.connection():
        raise RuntimeError("the channel reconnected: streams are not on one connection")

    result["with_streams"] = await measure(unary, args.server_pid, args.duration, args.warmup,
                                           args.concurrency)
    result["server_after"] = await open_streams_info(channel)
    result["client_streams_open"] = len(conn.streams)
    result["same_connection"] = conn is await channel.connection()

    for call in calls:
        call.cancel()
    await asyncio.sleep(0.2)
    await channel.close()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--streams", type=int, default=5000)
    args = ap.parse_args(argv)
    import uvloop
    result = uvloop.run(main_async(args))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
