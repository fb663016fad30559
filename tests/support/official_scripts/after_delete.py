"""An official producer whose topic is deleted through the admin API.

args: url, admin_addr, topic. Sends once, deletes the topic, sends again (recording the
outcome: the broker no longer knows the producer id), then re-creates the producer (which
auto-creates the topic again) and sends once more.
Returns {"first_send", "delete_error", "send_after_delete", "recreated_id", "old_id",
"send_after_recreate", "health_after_recreate"}.
"""

import asyncio

from _lib import admin_delete_topic, error_info, health, new_client, new_producer, producer_ids


async def attempt(coro, timeout=20):
    try:
        return {"ok": True, "value": await asyncio.wait_for(coro, timeout)}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"ok": False, **error_info(exc)}


async def main(args):
    url, topic = args["url"], args["topic"]
    client = await new_client(url)
    producer = await new_producer(client, topic, "doomed-producer")
    old_id = producer_ids(producer)[0]
    first = await attempt(producer.send(b"before delete", {}))
    delete_error = await admin_delete_topic(args["admin_addr"], topic)
    after = await attempt(producer.send(b"after delete", {}))
    recreate = await attempt(producer.create())
    new_id = producer_ids(producer)[0]
    again = await attempt(producer.send(b"after recreate", {}))
    return {"first_send": first, "delete_error": delete_error, "send_after_delete": after,
            "recreate": recreate, "old_id": old_id, "recreated_id": new_id,
            "send_after_recreate": again,
            "health_after_recreate": await health(url, "producer", new_id)}
