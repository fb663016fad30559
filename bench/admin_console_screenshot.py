"""Regenerates docs/admin-console.png: the web console's page of a topic with live traffic.

    .venv/bin/python -m bench.admin_console_screenshot [--out docs/admin-console.png]
        [--page topic|namespace|dashboard]

A standalone broker and `danube admin serve` on free ports; a few topics with producers
publishing at steady rates and subscriptions that keep up, lag or have no consumer (so
rates, backlogs and unacked counts are not all zero); after a few seconds (the broker's
rates are sampled every 2 s) headless Chromium (/usr/bin/chromium, through Playwright)
saves the page."""

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile

from bench._proc import REPO, reap_all
from bench.admin_scale import ADMIN_LISTEN, CONSOLE_LISTEN, start

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# (topic, reliable, messages per second)
TRAFFIC = [("orders", True, 120), ("payments", True, 40), ("clicks", False, 300),
           ("inventory", True, 15), ("audit-log", True, 5)]


def main():
    ap = argparse.ArgumentParser(prog="python -m bench.admin_console_screenshot",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "admin-console.png"))
    ap.add_argument("--page", choices=("topic", "namespace", "dashboard"), default="topic")
    ap.add_argument("--warm-up", type=float, default=7.0, metavar="SECONDS")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="danube-console-shot-")
    try:
        broker = start(
            [sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
             "--data-dir", os.path.join(work, "data"), "--broker-addr", "127.0.0.1:0",
             "--admin-addr", "127.0.0.1:0"],
            os.path.join(work, "broker.log"), ADMIN_LISTEN, ready="broker ready")
        admin_url = f"http://{broker.match.group(1)}:{broker.match.group(2)}"
        client_port = re.search(r"client gRPC .* listening on [\d.]+:(\d+)",
                                open(broker.log_path).read()).group(1)
        console = start(
            [sys.executable, "-P", "-m", "danube", "admin", "serve", "--listen", "127.0.0.1:0",
             "--broker-endpoint", admin_url, "--cache-ttl-ms", "1000"],
            os.path.join(work, "console.log"), CONSOLE_LISTEN)
        asyncio.run(scene(admin_url, f"http://127.0.0.1:{client_port}",
                          console.match.group(1), args))
    finally:
        reap_all()
        shutil.rmtree(work, ignore_errors=True)
    print(f"saved {args.out} ({os.path.getsize(args.out):,} bytes)")


async def scene(admin_url, client_url, console_url, args):
    from playwright.async_api import async_playwright

    from danube.client import DanubeClient
    from danube.client.admin import AdminClient
    from danube.proto import DanubeAdmin_pb2 as adm

    admin = AdminClient(admin_url)
    client = DanubeClient(client_url)
    tasks = []
    try:
        for name, reliable, _ in TRAFFIC:
            await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
                name=f"/default/{name}",
                dispatch_strategy=adm.Reliable if reliable else adm.NonReliable))
        orders = "/default/orders"
        # billing keeps up (two shared consumers), analytics takes 25 ms a message (lags
        # behind 120 msg/s), archive has no consumer connected (its backlog is everything).
        for i in range(2):
            c = await client.subscribe(orders, f"billing-{i}", "billing", sub_type="shared")
            tasks.append(asyncio.create_task(consume(c)))
        c = await client.subscribe(orders, "analytics-0", "analytics", sub_type="exclusive")
        tasks.append(asyncio.create_task(consume(c, pause=0.025)))
        archive = await client.subscribe(orders, "archive-0", "archive", sub_type="failover")
        await archive.close()
        for name, reliable, _ in TRAFFIC[1:]:
            c = await client.subscribe(f"/default/{name}", "reader", "reader")
            tasks.append(asyncio.create_task(consume(c)))
        for name, reliable, rate in TRAFFIC:
            p = await client.create_producer(f"/default/{name}", f"{name}-producer",
                                             reliable=reliable)
            tasks.append(asyncio.create_task(publish(p, rate)))
        await asyncio.sleep(args.warm_up)

        path = {"topic": "/topics/default/orders", "namespace": "/namespaces/default",
                "dashboard": "/"}[args.page]
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path="/usr/bin/chromium",
                                               args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 640})
            await page.goto(console_url + path)
            await page.wait_for_selector("#live-status:has-text('updated')", timeout=15_000)
            await page.screenshot(path=args.out, full_page=True)
            await browser.close()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
        await admin.close()


async def publish(producer, rate):
    n = 0
    loop = asyncio.get_running_loop()
    start_t = loop.time()
    while True:
        n += 1
        await producer.send(b'{"order": %d, "amount": 42.5, "currency": "EUR"}' % n)
        await asyncio.sleep(max(0.0, start_t + n / rate - loop.time()))


async def consume(consumer, pause=0.0):
    while True:
        msg = await consumer.receive()
        if pause:
            await asyncio.sleep(pause)
        await consumer.ack(msg)


if __name__ == "__main__":
    main()
