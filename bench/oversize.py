"""How long a publish over the broker's size limits takes to be refused, through each client.

    .venv/bin/python setup.py build_ext --inplace     # bench.* imports danube from the tree
    .venv/bin/python -m bench.oversize [--sizes 20000000,12000000] [--repeat 3]

One broker with the default limits (policies.max_message_size 10 MiB, grpc.max_message_size
16 MiB); for each size, one producer per client publishes a payload of that size and the
time until the call fails (or succeeds) is taken inside the client's process, after the
producer exists, so process start-up and connecting are not counted:

* `danube produce -f FILE` (our CLI, in a subprocess): its JSON summary's elapsed_s, which
  runs from the producer's creation to the end of the sends; also the whole process's wall
  time for reference;
* our client library (`danube.client`, in this process);
* a plain grpcio channel calling SendMessage (our generated messages);
* the official Python client (`danube-client`, its own interpreter, DANUBE_OFFICIAL_PYTHON),
  given --official-timeout seconds: it retries RESOURCE_EXHAUSTED without end.

Timings on a shared 2-core machine are noisy; the table shows the median of --repeat runs.
"""

import argparse
import asyncio
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

from bench._proc import REPO, reap_all, repo_env
from bench.e2e.runner import OFFICIAL_PYTHON, Broker

DEFAULT_SIZES = "20000000,12000000,10000000"

OFFICIAL_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys, time
    from danube import DanubeClientBuilder

    async def main(url, topic, size, timeout, repeat):
        client = await DanubeClientBuilder().service_url(url).build()
        producer = client.new_producer().with_topic(topic).with_name("oversize-official").build()
        await producer.create()
        payload = b"x" * size
        out = []
        for _ in range(repeat):
            start = time.perf_counter()
            try:
                await asyncio.wait_for(producer.send(payload, {}), timeout)
                outcome = "OK"
            except asyncio.TimeoutError:
                outcome = f"no answer in {timeout:g} s (retrying)"
            except Exception as exc:
                code = getattr(exc, "code", None)
                outcome = f"{type(exc).__name__}: {exc}"
                if callable(code):
                    outcome = f"{code().name}: {exc.details()}"
            out.append([time.perf_counter() - start, outcome])
        print(json.dumps(out), flush=True)
        import os
        os._exit(0)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                     int(sys.argv[5])))
""")


def topic():
    return f"/default/oversize-{uuid.uuid4().hex[:10]}"


def short(text, n=110):
    # Each run has a topic of its own; the name would make equal outcomes look different.
    text = re.sub(r"/default/oversize-[0-9a-f]+", "TOPIC", " ".join(str(text).split()))
    return text if len(text) <= n else text[:n - 3] + "..."


def run_cli(url, size, repeat, scratch):
    path = scratch / f"payload-{size}.bin"
    if not path.exists():
        path.write_bytes(b"x" * size)
    runs = []
    for _ in range(repeat):
        cmd = [sys.executable, "-P", "-m", "danube", "produce", "-s", url, "-t", topic(),
               "-f", str(path), "--output", "json"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=repo_env(), cwd=REPO,
                              timeout=120)
        wall = time.perf_counter() - start
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        summary = lines[-1] if lines else {}
        errors = [x["error"] for x in lines if "error" in x]
        outcome = (errors[0] if errors else "OK" if summary.get("sent") else
                   short(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?"))
        runs.append((summary.get("elapsed_s", float("nan")), f"exit {proc.returncode}: "
                     + outcome, wall))
    return runs


async def run_library(url, size, repeat):
    from danube.client import DanubeClient, DanubeError
    client = DanubeClient(url)
    runs = []
    try:
        producer = await client.create_producer(topic(), "oversize-lib")
        payload = b"x" * size
        for _ in range(repeat):
            start = time.perf_counter()
            try:
                await producer.send(payload)
                outcome = "OK"
            except DanubeError as exc:
                outcome = str(exc)
            runs.append((time.perf_counter() - start, outcome, None))
    finally:
        await client.close()
    return runs


def run_grpcio(addr, size, repeat):
    import grpc
    from danube.proto import DanubeApi_pb2 as pb
    runs = []
    with grpc.insecure_channel(addr) as ch:
        name = topic()
        create = ch.unary_unary("/danube.ProducerService/CreateProducer",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=pb.ProducerResponse.FromString)
        producer_id = create(pb.ProducerRequest(producer_name="oversize-grpcio",
                                                topic_name=name), timeout=10).producer_id
        send = ch.unary_unary("/danube.ProducerService/SendMessage",
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=pb.MessageResponse.FromString)
        message = pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=producer_id,
                                                                 topic_name=name),
                                   payload=b"x" * size, producer_name="oversize-grpcio")
        for _ in range(repeat):
            start = time.perf_counter()
            try:
                send(message, timeout=30)
                outcome = "OK"
            except grpc.RpcError as exc:
                outcome = f"{exc.code().name}: {exc.details()}"
            runs.append((time.perf_counter() - start, outcome, None))
    return runs


def run_official(url, size, repeat, timeout, scratch):
    if not os.path.exists(OFFICIAL_PYTHON):
        return None
    script = scratch / "official_oversize.py"
    script.write_text(OFFICIAL_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([OFFICIAL_PYTHON, "-I", str(script), url, topic(), str(size),
                           str(timeout), str(repeat)], capture_output=True, text=True,
                          env=env, cwd=scratch, timeout=repeat * (timeout + 10) + 30)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return [(float("nan"), "failed: " + short(proc.stderr.strip()[-300:]), None)]
    return [(t, outcome, None) for t, outcome in json.loads(lines[-1])]


def summarize(runs):
    times = [r[0] for r in runs]
    walls = [r[2] for r in runs if r[2] is not None]
    # Sizes in the messages differ by a byte from run to run (varints): outcomes that
    # differ only in numbers are one outcome.
    kinds = collections.Counter(re.sub(r"\d+", "N", short(r[1], 1000)) for r in runs)
    shown = {}
    for r in runs:
        shown.setdefault(re.sub(r"\d+", "N", short(r[1], 1000)), short(r[1], 1000))
    outcome = " | ".join(shown[k] for k, _ in kinds.most_common())
    return (statistics.median(times), statistics.median(walls) if walls else None, outcome)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.oversize", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="payload sizes in bytes")
    ap.add_argument("--repeat", type=int, default=3, help="calls per client and size")
    ap.add_argument("--official-timeout", type=float, default=10.0,
                    help="seconds the official client is given per call")
    ap.add_argument("--clients", default="cli,library,grpcio,official")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    clients = args.clients.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="danube-oversize-"))
    rows = []
    broker = None
    try:
        broker = Broker(scratch / "data", scratch / "broker.log")
        addr = broker.url[len("http://"):]
        print(f"bench.oversize: broker at {broker.url}, default limits (policy 10 MiB, "
              f"transport 16 MiB), {args.repeat} calls each", flush=True)
        for size in sizes:
            for name in clients:
                if name == "cli":
                    runs = run_cli(broker.url, size, args.repeat, scratch)
                    label = "danube produce -f (CLI)"
                elif name == "library":
                    runs = asyncio.run(run_library(broker.url, size, args.repeat))
                    label = "danube.client (ours)"
                elif name == "grpcio":
                    runs = run_grpcio(addr, size, args.repeat)
                    label = "grpcio SendMessage"
                elif name == "official":
                    runs = run_official(broker.url, size, args.repeat,
                                        args.official_timeout, scratch)
                    label = "official danube-client"
                    if runs is None:
                        print(f"  (no official client at {OFFICIAL_PYTHON}: skipped)")
                        continue
                else:
                    ap.error(f"unknown client {name!r}")
                median, wall, outcome = summarize(runs)
                rows.append((size, label, median, wall, outcome))
                print(f"  {size:>10,} B  {label:<24} {median * 1000:9.1f} ms"
                      + (f"  (process {wall:.2f} s)" if wall is not None else "")
                      + f"  {short(outcome)}", flush=True)
    finally:
        reap_all()
    print()
    print("| payload | client | call time (median) | outcome |")
    print("|---:|---|---:|---|")
    for size, label, median, wall, outcome in rows:
        extra = f" (process {wall:.2f} s)" if wall is not None else ""
        print(f"| {size:,} B | {label} | {median * 1000:.1f} ms{extra} | "
              f"{short(outcome, 140)} |")


if __name__ == "__main__":
    main()
