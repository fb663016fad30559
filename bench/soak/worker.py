"""A soak producer or consumer process; it appends what happened to --out, one line each.

    python -m bench.soak.worker produce --url U --topic T --name P --rate R --out F [--reliable]
    python -m bench.soak.worker consume --url U --topic T --name C --subscription S --type X --out F

Producer lines: `A seq` once the broker acknowledged it, `F seq` when the send failed for good
(it is then sent again under the same seq). Consumer lines: `S` once subscribed, then
`R seq time_ns offset key` per message received, written before the ack. A payload is
"<producer>:<seq>:<key>" padded to --size bytes; the routing key is the key.
"""

import argparse
import asyncio
import signal
import sys
import time

from danube.client import DanubeClient, RetryPolicy

# Generous retries: the broker is killed on purpose and takes a moment to come back.
RETRY = RetryPolicy(max_retries=30, base_backoff_ms=100, max_backoff_ms=1000)
KEYS = 16


async def _retrying(what, make):
    for attempt in range(120):
        try:
            return await make()
        except Exception as exc:  # noqa: BLE001 - the broker may be down: try again
            if attempt % 10 == 0:
                print(f"{what}: {exc}; retrying", file=sys.stderr, flush=True)
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{what}: gave up")


async def produce(args, stop):
    client = DanubeClient(args.url, retry=RETRY)
    producer = await _retrying("create producer", lambda: client.create_producer(
        args.topic, args.name, reliable=args.reliable))
    out = open(args.out, "a", buffering=1)
    inflight = asyncio.Semaphore(64)
    tasks = set()

    async def send(seq):
        key = f"k{seq % KEYS}"
        body = f"{args.name}:{seq}:{key}:".encode().ljust(args.size, b".")
        try:
            while True:
                try:
                    await producer.send(body, key=key)
                    out.write(f"A {seq}\n")
                    return
                except Exception:  # noqa: BLE001 - sent again under the same seq
                    out.write(f"F {seq}\n")
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.2)
        finally:
            inflight.release()

    loop = asyncio.get_running_loop()
    start, seq = loop.time(), 0
    while not stop.is_set():
        due = start + seq / args.rate
        if due > loop.time():
            try:
                await asyncio.wait_for(stop.wait(), due - loop.time())
                break
            except TimeoutError:
                pass
        await inflight.acquire()
        task = loop.create_task(send(seq))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        seq += 1
    await asyncio.gather(*tasks, return_exceptions=True)
    out.close()
    await client.close()


async def consume(args, stop):
    client = DanubeClient(args.url, retry=RETRY)
    consumer = await _retrying("subscribe", lambda: client.subscribe(
        args.topic, args.name, args.subscription, args.type))
    out = open(args.out, "a", buffering=1)
    out.write("S\n")
    while not stop.is_set():
        receive = asyncio.ensure_future(consumer.receive())
        halt = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({receive, halt}, return_when=asyncio.FIRST_COMPLETED)
        if receive not in done:
            receive.cancel()
            break
        halt.cancel()
        msg = receive.result()
        _, seq, key, _ = bytes(msg.payload).split(b":", 3)
        out.write(f"R {int(seq)} {time.time_ns()} {msg.msg_id.topic_offset} {key.decode()}\n")
        try:
            await consumer.ack(msg)
        except Exception:  # noqa: BLE001 - not acked: the broker sends it again
            pass
    out.close()
    await client.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("produce", "consume"))
    ap.add_argument("--url", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--reliable", action="store_true")
    ap.add_argument("--subscription")
    ap.add_argument("--type", default="shared")
    args = ap.parse_args()
    import uvloop

    async def run():
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await (produce if args.mode == "produce" else consume)(args, stop)
    uvloop.run(run())


if __name__ == "__main__":
    main()
