"""bench.connect.postgres: sink-postgres against plain psycopg, in one run (issue 39).
Reported, not asserted.

    python -m bench.connect.postgres [--rows N] [--batch B] [--rounds R]

A PostgreSQL of its own (Debian's `postgresql`, as the tests start it) and a broker.
N JSON records (id, name, qty, meta: ~90 B) upserted by id into a table with a primary key,
in batches of B:
- peer: the same rows with psycopg 3's `executemany` of `INSERT ... ON CONFLICT (id) DO
  UPDATE` (pipelined by psycopg), one transaction per batch, from Python dicts (no JSON
  parsing, no broker);
- connector: `danube connect run` sink-postgres reading the records from a reliable topic
  filled beforehand, timed from its first written batch to its N-th record (its processed
  counter), acknowledgements included.
Also reported: source-postgres-cdc's rate for N single-row inserts (committed beforehand,
read from the slot and published keyed by primary key), with no peer (psycopg 3 has no
replication client to compare with)."""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

from bench.connect.connector import Connector, backlog_for_sink, core
from bench.e2e.runner import Broker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "support"))

from postgres_process import Postgres  # noqa: E402 - tests/support, added above

COLUMNS = "id bigint PRIMARY KEY, name text NOT NULL, qty int, meta jsonb"
UPSERT = ("INSERT INTO {t} (id, name, qty, meta) VALUES (%s, %s, %s, %s) ON CONFLICT (id) "
          "DO UPDATE SET name = EXCLUDED.name, qty = EXCLUDED.qty, meta = EXCLUDED.meta")


def rows(n):
    return [{"id": i, "name": f"name-{i}", "qty": i % 1000, "meta": {"k": i % 7}}
            for i in range(n)]


def direct(pg, table, data, batch):
    import psycopg
    from psycopg.types.json import Jsonb
    with psycopg.connect(pg.url) as conn:
        conn.execute(f"CREATE TABLE {table} ({COLUMNS})")
        conn.commit()
        start = time.perf_counter()
        with conn.cursor() as cur:
            for i in range(0, len(data), batch):
                cur.executemany(UPSERT.format(t=table), [
                    (r["id"], r["name"], r["qty"], Jsonb(r["meta"]))
                    for r in data[i:i + batch]])
                conn.commit()
        return time.perf_counter() - start


def via_connector(broker, pg, workdir, table, data, batch):
    import psycopg
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} ({COLUMNS})")
    name = f"bench-pg-{uuid.uuid4().hex[:6]}"
    topic = f"/default/{name}"
    text = core(broker, name, "sink-postgres", batch) + f'''[postgres]
connection_url = "{pg.url}"
[[postgres.routes]]
from = "{topic}"
subscription = "bench"
to = "{table}"
'''

    backlog_for_sink(broker, workdir, topic, text, data)
    conn = Connector(workdir, text)
    try:
        return conn.timed_until(len(data))
    finally:
        conn.stop()


def cdc_rate(broker, pg, workdir, n):
    import psycopg
    table = f"cdc_{uuid.uuid4().hex[:6]}"
    name = f"bench-cdc-{uuid.uuid4().hex[:6]}"
    slot = name.replace("-", "_")
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} ({COLUMNS})")
    text = core(broker, name, "source-postgres-cdc", 1000) + f'''[postgres]
connection_url = "{pg.url}"
slot_name = "{slot}"
publication_name = "{slot}"
[[postgres.routes]]
table = "{table}"
to = "/default/{name}"
'''
    conn = Connector(workdir, text)
    while not conn.ready():
        time.sleep(0.05)
    conn.stop()                  # slot and publication made: the changes wait in the slot
    with psycopg.connect(pg.url, autocommit=True) as db:
        with db.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} (id, name, qty) VALUES (%s, %s, %s)",
                            [(i, f"n{i}", i) for i in range(n)])
    conn = Connector(workdir, text)
    try:
        return conn.timed_until(n)
    finally:
        conn.stop()


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.connect.postgres")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cdc", type=int, default=20_000)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-connect-pg-")
    broker = Broker(os.path.join(workdir, "data"), os.path.join(workdir, "broker.log"))
    pg = Postgres().start()
    data = rows(args.rows)
    results = []
    try:
        for r in range(args.rounds):
            peer = direct(pg, f"direct_{r}", data, args.batch)
            ours = via_connector(broker, pg, workdir, f"sink_{r}", data, args.batch)
            result = {"case": "sink-postgres", "round": r + 1, "rows": args.rows,
                      "batch": args.batch, "direct_rows_per_s": round(args.rows / peer),
                      "connector_rows_per_s": round(args.rows / ours),
                      "ratio": round(peer / ours, 2), "load": os.getloadavg()[0]}
            results.append(result)
            print(json.dumps(result), flush=True)
        if args.cdc:
            seconds = cdc_rate(broker, pg, workdir, args.cdc)
            result = {"case": "source-postgres-cdc", "changes": args.cdc,
                      "changes_per_s": round(args.cdc / seconds),
                      "load": os.getloadavg()[0]}
            results.append(result)
            print(json.dumps(result), flush=True)
    finally:
        broker.proc.terminate()
        broker.proc.wait(30)
        pg.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
