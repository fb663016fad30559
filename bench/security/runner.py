"""bench.security: TLS + JWT + RBAC against plain text without auth, in one run.

    .venv/bin/python -m bench.security              # 3 rounds x 5 s windows, ~5 min
    .venv/bin/python -m bench.security --quick      # 1 round x 2 s windows, ~1 min

Two brokers run side by side with the same storage settings: one in plain text with
`auth.mode: none`, one in `auth.mode: tls` (TLS on both ports, a JWT on every call, RBAC with
the load's principal bound to a role at namespace scope, so every call takes the ordinary,
non-super-admin path). Each measurement runs in a fresh load process against one broker at a
time, alternating which goes first from round to round; the tables give the median over the
rounds. See bench/README.md for the figures and what they mean.
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import shutil
import time

from bench._proc import REPO, reap_all, repo_env, start
from bench.e2e.common import format_table

CLIENT_LISTEN = re.compile(r"client gRPC .* listening on ([\d.]+):(\d+)")
ADMIN_LISTEN = re.compile(r"admin gRPC .* listening on ([\d.]+):(\d+)")
SECRET = "bench-secret-key-long-enough-for-hs256!!"
PRINCIPAL = "bench-app"
LOOKUP_TOPIC = "/default/bench-lookup"
PUBLISH_TOPIC = "/default/bench-publish"
# measurement -> (worker mode, producers, target ratio of secure to plain). Publish twice:
# with 4 producers, one batch in flight each, the rate is bound by each batch's round trip
# (the fsync of its group commit included); with 16 the broker is saturated, which is
# the capacity the target is about.
MEASUREMENTS = {"unary": ("unary", 0, 0.6), "latency": ("latency", 0, None),
                "publish": ("publish", 4, None), "publish16": ("publish", 16, 0.8)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s windows")
    ap.add_argument("--json", default=os.path.join(REPO, "bench", "results", "security.json"))
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2.0, 0.5
    work = tempfile.mkdtemp(prefix="danube-security-")
    try:
        results = run(args, work)
    finally:
        reap_all()
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nresults written to {args.json}")


def run(args, work):
    print("load average %.2f %.2f %.2f (2 cores; other work on the machine skews both sides "
          "alike)" % os.getloadavg(), flush=True)
    certs = write_certs(work)
    brokers = {"plain": Broker(work, "plain", plain_yaml()),
               "tls": Broker(work, "tls", secure_yaml(certs, jwt=False),
                             "--insecure-allow-unauthenticated"),
               "secure": Broker(work, "secure", secure_yaml(certs))}
    tokens = {"plain": None, "tls": None, "secure": mint(PRINCIPAL)}
    asyncio.run(prepare(brokers, certs))
    raw = {name: {b: [] for b in brokers} for name in MEASUREMENTS}
    for r in range(args.rounds):
        order = list(brokers)[r % 3:] + list(brokers)[:r % 3]
        for name, (mode, producers, _) in MEASUREMENTS.items():
            for b in order:
                broker = brokers[b]
                topic = PUBLISH_TOPIC if mode == "publish" else LOOKUP_TOPIC
                cmd = [sys.executable, "-P", "-m", "bench.security.worker", mode,
                       "--addr", broker.client_addr, "--broker-pid", str(broker.proc.pid),
                       "--topic", topic, "--duration", str(args.duration),
                       "--warmup", str(args.warmup), "--concurrency", str(args.concurrency),
                       "--producers", str(producers)]
                if b != "plain":
                    cmd += ["--ca", certs["ca"]]
                if tokens[b]:
                    cmd += ["--token", tokens[b]]
                print(f"round {r + 1}/{args.rounds}: {name} on {b} ...", flush=True)
                out = subprocess.run(cmd, env=repo_env(), cwd=REPO, capture_output=True,
                                     text=True, timeout=args.warmup + args.duration + 120)
                if out.returncode != 0:
                    raise RuntimeError(f"worker {name} on {b} failed:\n{out.stderr}")
                raw[name][b].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for broker in brokers.values():
        broker.stop()
    results = {"config": vars(args), "raw": raw, "in_process": in_process()}
    report(results)
    return results


class Broker:
    def __init__(self, work, name, yaml_text, *extra):
        path = os.path.join(work, f"{name}.yml")
        with open(path, "w") as f:
            f.write(yaml_text)
        child = start([sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
                       "--config-file", path, "--data-dir", os.path.join(work, f"{name}-data"),
                       *extra],
                      os.path.join(work, f"{name}.log"), CLIENT_LISTEN, ready="broker ready")
        self.proc = child.proc
        self.stop = child.stop
        self.client_addr = "%s:%s" % child.match.groups()
        with open(child.log_path) as f:
            self.admin_addr = "%s:%s" % ADMIN_LISTEN.search(f.read()).groups()


def write_certs(work):
    import trustme
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: os.path.join(work, f"{name}.pem") for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["cert"])
    server.private_key_pem.write_to_path(paths["key"])
    return paths


PORTS = "broker: {host: 127.0.0.1, ports: {client: 0, admin: 0}}\n"


def plain_yaml():
    return PORTS + "auth: {mode: none}\n"


def secure_yaml(certs, jwt=True):
    text = PORTS + (
        "admin_tls: true\n"
        "auth:\n"
        "  mode: tls\n"
        f'  tls: {{cert_file: "{certs["cert"]}", key_file: "{certs["key"]}", '
        f'ca_file: "{certs["ca"]}"}}\n'
        '  super_admins: ["admin"]\n'
        )
    return text + (f'  jwt: {{secret_key: "{SECRET}", issuer: danube-auth}}\n' if jwt else "")


def mint(subject):
    from danube.security.tokens import mint_token
    return mint_token(subject, secret_key=SECRET, ttl=3600, principal_type="service_account")


async def prepare(brokers, certs):
    """The load's role and binding on the secure broker; the lookup topic on both."""
    from danube.client.admin import AdminClient
    from danube.proto import DanubeAdmin_pb2 as adm
    from danube.rpc.client import client_ssl_context

    for name, broker in brokers.items():
        secure, tls = name == "secure", name != "plain"
        url = ("https://" if tls else "http://") + broker.admin_addr
        async with AdminClient(url, ssl=client_ssl_context(ca_file=certs["ca"]) if tls
                               else None, token=mint("admin") if secure else None) as admin:
            if secure:
                await admin.call("SecurityAdmin", "CreateRole", adm.CreateRoleRequest(
                    role=adm.RoleDefinition(name="bench", permissions=["Lookup", "Produce"])),
                    what="create role")
                await admin.call("SecurityAdmin", "CreateBinding", adm.CreateBindingRequest(
                    binding=adm.BindingDefinition(
                        id="bench", principal_type="service_account", principal_name=PRINCIPAL,
                        role_names=["bench"], scope="namespace", resource_name="default")),
                    what="create binding")
            await admin.call("TopicAdmin", "CreateTopic",
                             adm.NewTopicRequest(name=LOOKUP_TOPIC), what="create topic")


def in_process():
    """What the guard itself costs per call, without the network: verifying a token (the
    first time, and from the cache every later call) and the RBAC decision."""
    from danube.metadata.memory import MemoryStore
    from danube.security.rbac import Rbac, topic
    from danube.security.tokens import TokenVerifier

    header = f"Bearer {mint(PRINCIPAL)}".encode()
    uncached = TokenVerifier(secret_key=SECRET, cache_size=0)
    cached = TokenVerifier(secret_key=SECRET)
    principal = cached.verify_header(header)

    async def rbac():
        r = Rbac(MemoryStore(), super_admins=["admin"])
        await r.put_role({"name": "bench", "permissions": ["Lookup", "Produce"],
                          "system": False})
        await r.put_binding({"id": "bench", "principal_type": "service_account",
                             "principal_name": PRINCIPAL, "role_names": ["bench"],
                             "scope": "namespace", "resource_name": "default"})
        await r.reload()
        return r
    r = asyncio.run(rbac())
    resource = topic(LOOKUP_TOPIC)
    assert r.grant(principal, "Lookup", resource) is not None

    def per_call(fn, n):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6
    return {"verify_uncached_us": per_call(lambda: uncached.verify_header(header), 2000),
            "verify_cached_us": per_call(lambda: cached.verify_header(header), 200_000),
            "rbac_grant_us": per_call(lambda: r.grant(principal, "Lookup", resource), 200_000)}


def _median(rows, key):
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else None


def report(results):
    raw = results["raw"]
    rows, lines = [], []
    for name, (_, producers, target) in MEASUREMENTS.items():
        if name == "latency":
            p, t, s = (_median(raw[name][b], "p50_us") for b in ("plain", "tls", "secure"))
            rows.append(["one call at a time, p50 us", f"{p:.0f}", f"{t:.0f}", f"{s:.0f}",
                         f"{p / s:.2f}x", "", ""])
            lines.append(f"per call, p50: TLS adds {t - p:.0f} us, the token and RBAC check "
                         f"{s - t:.0f} us more")
            continue
        p, t, s = (_median(raw[name][b], "per_s") for b in ("plain", "tls", "secure"))
        label = ("unary TopicLookup calls/s (64 in flight)" if name == "unary"
                 else f"batched reliable publish msgs/s ({producers} producers)")
        # the median of each round's ratio: the rounds pair measurements taken seconds apart,
        # so a background load that comes and goes skews a pair less than the medians
        ratio = statistics.median(sr["per_s"] / pr["per_s"]
                                  for pr, sr in zip(raw[name]["plain"], raw[name]["secure"]))
        verdict = "" if target is None else "met" if ratio >= target else "NOT met"
        rows.append([label, f"{p:,.0f}", f"{t:,.0f}", f"{s:,.0f}", f"{ratio:.2f}x",
                     f">= {target}x" if target else "", verdict])
        per = "call" if name == "unary" else "msg"
        cpu = []
        for b, rate in (("plain", p), ("tls", t), ("secure", s)):
            cores = _median(raw[name][b], "broker_cpu")
            cpu.append(f"{b} {cores / rate * 1e6:.2f}")
        lines.append(f"{label}: broker CPU us/{per}: " + ", ".join(cpu))
        errors = sum(row["errors"] for b in raw[name] for row in raw[name][b])
        if errors:
            lines.append(f"{label}: {errors} failed calls (see the JSON)")
    print()
    print(format_table(["measurement", "plain, no auth", "TLS only", "TLS+JWT+RBAC",
                        "ratio", "target", ""], rows))
    print()
    for line in lines:
        print(line)
    ip = results["in_process"]
    print(f"in process: token verify {ip['verify_uncached_us']:.1f} us uncached, "
          f"{ip['verify_cached_us']:.2f} us cached; RBAC grant {ip['rbac_grant_us']:.2f} us")
