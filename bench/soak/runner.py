"""bench.soak: a broker under steady load with random kills, then the checks.

    .venv/bin/python -m bench.soak                       # 2 minutes, as the test command
    .venv/bin/python -m bench.soak --duration 3600       # the 1-hour run of bench/README.md

Processes: one broker (fixed ports, one data directory for all its lives); a producer per
topic (/default/soak-reliable, reliable; /default/soak-plain, non-reliable) at --rate msgs/s;
on each topic four subscriptions, one per type, with two consumers each (one for
Exclusive). Every ~--consumer-kill-every seconds a random consumer gets SIGKILL and is started
again; every ~--broker-kill-every seconds the broker gets SIGKILL and is started again on
the same ports and data. At the end the producers stop, the consumers drain (up to
--drain seconds), and the logs are checked (bench/soak/verify.py). Exit status 1 when an
acknowledged reliable message was not delivered, an order promise was broken, or the
broker's memory or descriptors grew past the limits.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bench._proc import REPO, popen, reap_all, repo_env, start
from bench.e2e.common import format_table
from bench.soak import verify
from danube.devcluster.procs import free_port

TOPICS = {"reliable": "/default/soak-reliable", "plain": "/default/soak-plain"}
TYPES = ("exclusive", "shared", "failover", "key_shared")
STALL = 30.0            # the drain gives up after this long without a delivery
_READY = re.compile(r"client gRPC .* listening on ([\d.]+):(\d+)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--rate", type=float, default=200.0, help="messages/s per producer")
    ap.add_argument("--consumer-kill-every", type=float, default=15.0, help="mean seconds")
    ap.add_argument("--broker-kill-every", type=float, default=45.0, help="mean seconds")
    ap.add_argument("--drain", type=float, default=600.0,
                    help="longest wait for the consumers to catch up (s)")
    ap.add_argument("--max-rss-growth", type=float, default=0.10)
    ap.add_argument("--max-fd-growth", type=int, default=32)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--keep", action="store_true", help="keep the logs and data")
    ap.add_argument("--json", default=os.path.join(REPO, "bench", "results", "soak.json"))
    args = ap.parse_args()
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    work = tempfile.mkdtemp(prefix="danube-soak-")
    ok = False
    try:
        results = Soak(args, work).run()
        ok = results["ok"]
    finally:
        reap_all()
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs and data kept in {work}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"results written to {args.json}")
    sys.exit(0 if ok else 1)


class Soak:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.ports = (free_port(), free_port())
        self.url = f"http://127.0.0.1:{self.ports[0]}"
        self.broker = None
        self.lifetime = 0
        self.samples = []
        self.consumers = {}          # name -> (args, Popen)
        self.events = {"broker_kills": 0, "consumer_kills": 0, "consumer_exits": 0}
        self._sampling = True

    # -- processes -----------------------------------------------------------------------

    def start_broker(self):
        self.lifetime += 1
        cmd = [sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
               "--data-dir", os.path.join(self.work, "data"),
               "--broker-addr", f"127.0.0.1:{self.ports[0]}",
               "--admin-addr", f"127.0.0.1:{self.ports[1]}"]
        self.broker = start(cmd, os.path.join(self.work, f"broker-{self.lifetime}.log"),
                            _READY, ready="broker ready")
        self.broker.born = time.monotonic()

    def worker(self, *argv):
        return popen([sys.executable, "-P", "-m", "bench.soak.worker", *argv],
                     env=repo_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                     stderr=open(os.path.join(self.work, "workers.err"), "a"))

    def start_consumer(self, name):
        argv = self.consumers[name][0]
        self.consumers[name] = (argv, self.worker(*argv))

    def add_consumer(self, tag, sub_type, index):
        name = f"cons-{tag}-{sub_type}-{index}"
        argv = ("consume", "--url", self.url, "--topic", TOPICS[tag], "--name", name,
                "--subscription", f"soak-{sub_type}", "--type", sub_type,
                "--out", os.path.join(self.work, f"{name}.log"))
        self.consumers[name] = (argv, None)
        self.start_consumer(name)

    # -- the run -------------------------------------------------------------------------

    def run(self):
        a = self.args
        print(f"soak: {a.duration:.0f} s, seed {a.seed}, {a.rate:.0f} msgs/s per producer, "
              f"work dir {self.work}", flush=True)
        self.start_broker()
        self.create_topics()
        for tag in TOPICS:
            for sub_type in TYPES:
                for i in range(1 if sub_type == "exclusive" else 2):
                    self.add_consumer(tag, sub_type, i)
        self.wait_subscribed()
        threading.Thread(target=self.sample, daemon=True).start()
        producers = {tag: self.worker(
            "produce", "--url", self.url, "--topic", topic, "--name", f"prod-{tag}",
            "--rate", str(a.rate), "--out", os.path.join(self.work, f"prod-{tag}.log"),
            *(["--reliable"] if tag == "reliable" else [])) for tag, topic in TOPICS.items()}
        self.chaos(time.monotonic() + a.duration)
        for p in producers.values():
            p.send_signal(signal.SIGTERM)
        for p in producers.values():
            p.wait(120)
        drained = self.drain()
        for _, proc in self.consumers.values():
            proc.send_signal(signal.SIGTERM)
        for _, proc in self.consumers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._sampling = False
        self.broker.stop()
        return self.report(drained)

    def create_topics(self):
        base = [sys.executable, "-P", "-m", "danube", "admin", "--endpoint",
                f"http://127.0.0.1:{self.ports[1]}", "topics", "create"]
        for tag, topic in TOPICS.items():
            strategy = "reliable" if tag == "reliable" else "non_reliable"
            subprocess.run([*base, topic, "--dispatch-strategy", strategy], check=True,
                           env=repo_env(), cwd=REPO, capture_output=True, timeout=60)

    def wait_subscribed(self, timeout=120):
        deadline = time.monotonic() + timeout
        for name in self.consumers:
            path = os.path.join(self.work, f"{name}.log")
            while not (os.path.exists(path) and open(path).read(1) == "S"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not subscribe; see {self.work}")
                time.sleep(0.1)

    def chaos(self, end):
        a, rng = self.args, self.rng
        next_consumer = time.monotonic() + rng.expovariate(1 / a.consumer_kill_every)
        next_broker = time.monotonic() + rng.expovariate(1 / a.broker_kill_every)
        last_report = time.monotonic()
        while (now := time.monotonic()) < end:
            for name, (_, proc) in list(self.consumers.items()):
                if proc.poll() is not None:       # it gave up on its own: start it again
                    self.events["consumer_exits"] += 1
                    self.start_consumer(name)
            if now >= next_consumer:
                name = rng.choice(sorted(self.consumers))
                self.consumers[name][1].kill()
                self.consumers[name][1].wait()
                time.sleep(rng.uniform(0, 1))
                self.start_consumer(name)
                self.events["consumer_kills"] += 1
                next_consumer = now + rng.expovariate(1 / a.consumer_kill_every)
            if now >= next_broker:
                self.broker.proc.kill()
                self.broker.proc.wait()
                self.events["broker_kills"] += 1
                self.start_broker()
                next_broker = time.monotonic() + rng.expovariate(1 / a.broker_kill_every)
            if now - last_report >= 10:
                last_report = now
                print(f"  {end - now:5.0f} s left: {self.events['broker_kills']} broker and "
                      f"{self.events['consumer_kills']} consumer kills", flush=True)
            time.sleep(0.2)

    def drain(self):
        """Wait until each reliable subscription has every acknowledged message, for as long
        as deliveries keep coming (a loaded machine drains slowly), at most --drain s."""
        acked, _ = verify.read_acked(os.path.join(self.work, "prod-reliable.log"))
        deadline = time.monotonic() + self.args.drain
        progress, last_change = None, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last_change < STALL:
            reports = [verify.subscription_report(self.work, "reliable", t, acked, True)
                       for t in TYPES]
            if not any(r["lost"] for r in reports):
                return True
            received = sum(r["received"] for r in reports)
            if received != progress:
                progress, last_change = received, time.monotonic()
            time.sleep(1)
        return False

    def sample(self):
        while self._sampling:
            broker = self.broker
            try:
                pid = broker.proc.pid
                with open(f"/proc/{pid}/status") as f:
                    rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                self.samples.append((self.lifetime, time.monotonic() - broker.born, rss, fds))
            except (OSError, StopIteration, AttributeError):
                pass                          # between two lives of the broker
            time.sleep(2)

    # -- the checks ----------------------------------------------------------------------

    def report(self, drained):
        a = self.args
        acked, failed = verify.read_acked(os.path.join(self.work, "prod-reliable.log"))
        subs = [verify.subscription_report(self.work, tag, t, acked, tag == "reliable")
                for tag in TOPICS for t in TYPES]
        lives = verify.lifetime_report(self.samples)
        problems = []
        for s in subs:
            if s.get("lost"):
                problems.append(f"{s['topic']}/{s['type']}: {s['lost']} acknowledged messages "
                                f"never delivered (e.g. {s['lost_sample']})")
            if s["order_violations"]:
                problems.append(f"{s['topic']}/{s['type']}: {s['order_violations']} first "
                                f"deliveries out of order")
            if not s["received"]:
                problems.append(f"{s['topic']}/{s['type']}: received nothing")
        for life in lives:
            if not life["judged"]:
                continue
            if life["rss_growth"] > a.max_rss_growth:
                problems.append(f"broker life {life['lifetime']}: RSS grew "
                                f"{life['rss_growth']:.0%} (limit {a.max_rss_growth:.0%})")
            if life["fds_last"] > life["fds_mid"] + a.max_fd_growth:
                problems.append(f"broker life {life['lifetime']}: descriptors "
                                f"{life['fds_mid']} -> {life['fds_last']}")
        rows = [[f"{s['topic']}/{s['type']}", str(s.get("acked", "-")), str(s["received"]),
                 str(s["unique"]), str(s["duplicates"]), str(s.get("lost", "-")),
                 "-" if s["order_violations"] is None else str(s["order_violations"])]
                for s in subs]
        print()
        print(format_table(["subscription", "acked", "received", "unique", "dups", "lost",
                            "order"], rows))
        life_rows = [[str(x["lifetime"]), f"{x['seconds']:.0f}",
                      f"{x.get('rss_mid_mb', 0):.1f}", f"{x.get('rss_last_mb', 0):.1f}",
                      f"{x['rss_growth']:+.1%}" if x["judged"] else "(short)",
                      str(x.get("fds_mid", "-")), str(x["fds_max"])] for x in lives]
        print()
        print(format_table(["broker life", "s", "RSS mid MB", "RSS last MB", "growth",
                            "fds mid", "fds max"], life_rows))
        print(f"\n{self.events['broker_kills']} broker kills, {self.events['consumer_kills']} "
              f"consumer kills, {self.events['consumer_exits']} consumer exits; "
              f"{failed} sends retried; drained: {drained}")
        for p in problems:
            print(f"PROBLEM: {p}")
        print("OK" if not problems else "FAILED")
        return {"ok": not problems, "problems": problems, "config": vars(a),
                "events": self.events, "subscriptions": subs, "broker_lives": lives,
                "sends_retried": failed, "drained": drained}

