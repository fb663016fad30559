"""A consumer that acks and prints a line "received <payload>" per delivery (flushed) until
the process is killed or run_for seconds have passed. Used with official_client.
spawn_scenario to run several client processes side by side.

args: url, topic, name, subscription, kind, run_for (seconds, 60); offsets (the lines are
then "received <payload> <topic> <offset>"); log (the client's own log on stderr). Prints
"subscribed" once its receive loop runs."""

import asyncio
import logging
import sys

from _lib import Receiver, new_client


async def main(args):
    if args.get("log"):
        # The client's own log (its recoveries) on stderr.
        logging.basicConfig(stream=sys.stderr, level=logging.DEBUG,
                            format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("grpc").setLevel(logging.WARNING)
        logging.getLogger("asyncio").setLevel(logging.WARNING)
    client = await new_client(args["url"])
    receiver = await Receiver.start(client, args["topic"], args["name"], args["subscription"],
                                    args.get("kind", "exclusive"))
    print("subscribed", flush=True)
    seen = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + args.get("run_for", 60)
    while loop.time() < end:
        for m in receiver.messages[seen:]:
            where = f" {m['topic']} {m['topic_offset']}" if args.get("offsets") else ""
            print(f"received {m['payload']}{where}", flush=True)
        seen = len(receiver.messages)
        await asyncio.sleep(0.01)
    return {"messages": receiver.messages}
