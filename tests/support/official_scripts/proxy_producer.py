"""An official reliable producer that keeps publishing through failures, for the proxy-mode
tests: it creates the producer (printing "created"), waits for `go_file`, then publishes
`{prefix}0, {prefix}1, ...` until `stop_file` exists. A send that raises is sent again (the same payload:
at least once), after `retry_pause` seconds. Every acknowledged publish is printed as
"acked <payload> <wall-clock time> <seconds the send took>", every failure as
"error <kind>".

args: url, topic, go_file, stop_file, interval, retry_pause; partitions, prefix (m), retry
(the producer's retry options: max_retries, base_backoff_ms, max_backoff_ms).
Returns {"acked": n, "errors": n}.
"""

import asyncio
import os
import time

from _lib import new_client, new_producer


async def main(args):
    client = await new_client(args["url"])
    producer = await new_producer(client, args["topic"], "proxy-producer",
                                  partitions=args.get("partitions"), reliable=True,
                                  retry=args.get("retry"))
    prefix = args.get("prefix", "m")
    print("created", flush=True)
    while not os.path.exists(args["go_file"]):
        await asyncio.sleep(0.02)
    seq = acked = errors = 0
    while not os.path.exists(args["stop_file"]):
        payload = f"{prefix}{seq}"
        sent = time.monotonic()
        try:
            await producer.send(payload.encode(), {})
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, try again
            errors += 1
            print("error", type(exc).__name__, str(exc).replace("\n", " ")[:200], flush=True)
            await asyncio.sleep(args["retry_pause"])
            continue
        print("acked", payload, repr(time.time()), f"{time.monotonic() - sent:.6f}",
              flush=True)
        acked += 1
        seq += 1
        await asyncio.sleep(args["interval"])
    await producer.close()
    return {"acked": acked, "errors": errors}
