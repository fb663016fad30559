"""What the soak's logs say: per subscription, whether every acknowledged message arrived
(reliable topic), whether first deliveries kept the order the type promises, and duplicates;
per broker lifetime, whether memory and descriptors stayed flat."""

import collections
import glob
import os
import statistics

# Which order a subscription type promises for first deliveries (reference b.5): the topic's
# (offsets increasing) for Exclusive and Failover, each key's for KeyShared, none for Shared.
# Judged on the reliable topic only: a non-reliable topic's offsets start again with each
# life of the broker.
SKEW_NS = 1_000_000_000
ORDER = {"exclusive": "topic", "failover": "topic", "key_shared": "key", "shared": None}


def read_acked(path):
    acked, failed = set(), 0
    with open(path) as f:
        for line in f:
            kind, _, seq = line.partition(" ")
            if kind == "A":
                acked.add(int(seq))
            elif kind == "F":
                failed += 1
    return acked, failed


def read_received(paths):
    """(seq, time_ns, offset, key) of every delivery to any consumer of one subscription, by
    time."""
    out = []
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("R "):
                    parts = line.split()
                    if len(parts) == 5:     # a line cut short by a kill -9 is skipped
                        out.append((int(parts[1]), int(parts[2]), int(parts[3]), parts[4]))
    out.sort(key=lambda r: r[1])
    return out


def order_violations(received, scope, skew_ns=SKEW_NS):
    """First deliveries that came after a later offset of the same group (the topic, or the
    key) had been delivered. Deliveries are merged from several consumer processes by their
    receipt time, which each process takes when it gets round to the message, so an offset
    counts as late only when a later one was seen more than `skew_ns` before it."""
    if scope is None:
        return 0
    seen, bad = set(), 0
    pending = collections.defaultdict(collections.deque)    # group -> (t, offset), recent
    settled = {}                                              # group -> max offset, older
    for _, t, offset, key in received:
        if offset in seen:
            continue                    # a redelivery: at-least-once allows it
        seen.add(offset)
        group = key if scope == "key" else ""
        recent = pending[group]
        while recent and recent[0][0] < t - skew_ns:
            settled[group] = max(settled.get(group, -1), recent.popleft()[1])
        if offset < settled.get(group, -1):
            bad += 1
        recent.append((t, offset))
    return bad


def subscription_report(work, topic_tag, sub_type, acked, reliable):
    paths = glob.glob(os.path.join(work, f"cons-{topic_tag}-{sub_type}-*.log"))
    received = read_received(paths)
    seqs = [r[0] for r in received]
    unique = set(seqs)
    report = {"topic": topic_tag, "type": sub_type, "received": len(seqs),
              "unique": len(unique), "duplicates": len(seqs) - len(unique),
              "order_violations": order_violations(received, ORDER[sub_type])
              if reliable else None}
    if reliable:
        report["acked"] = len(acked)
        report["lost"] = len(acked - unique)
        report["lost_sample"] = sorted(acked - unique)[:10]
    return report


def lifetime_report(samples):
    """samples: [(lifetime, t, rss_kb, fds)]. For each broker lifetime, RSS and descriptors
    over its middle and last thirds (the first third is warm-up)."""
    by_life = collections.defaultdict(list)
    for life, t, rss, fds in samples:
        by_life[life].append((t, rss, fds))
    out = []
    for life, rows in sorted(by_life.items()):
        third = len(rows) // 3
        if third < 2:
            out.append({"lifetime": life, "seconds": rows[-1][0] - rows[0][0] if rows else 0,
                        "samples": len(rows), "judged": False,
                        "rss_max_mb": max(r[1] for r in rows) / 1024 if rows else 0,
                        "fds_max": max(r[2] for r in rows) if rows else 0})
            continue
        middle, last = rows[third:2 * third], rows[2 * third:]
        rss_mid = statistics.median(r[1] for r in middle)
        rss_last = statistics.median(r[1] for r in last)
        out.append({"lifetime": life, "seconds": rows[-1][0] - rows[0][0],
                    "samples": len(rows), "judged": True,
                    "rss_mid_mb": rss_mid / 1024, "rss_last_mb": rss_last / 1024,
                    "rss_growth": rss_last / rss_mid - 1,
                    "rss_max_mb": max(r[1] for r in rows) / 1024,
                    "fds_mid": max(r[2] for r in middle), "fds_last": max(r[2] for r in last),
                    "fds_max": max(r[2] for r in rows)})
    return out
