"""Rolling restart of three brokers under load (`danube cluster roll`: drain, pause, SIGTERM,
start, wait active, next), with our producer and consumer and the official Python client's
on a 6-partition reliable topic, on a cluster from `danube cluster up` (the S3 tier on, each
broker's WAL its own): nothing acknowledged is lost, nothing is stored twice (a consumer may
get a message it had not acknowledged again, at the same offset), and both producers publish
again after the last restart (tests/support/rolling_restart.py; the gaps per broker are
printed, bench.cluster measures them against the 2 s target)."""

import json

from official_client import unique_topic
from rolling_restart import roll_under_load


def test_rolling_restart_loses_nothing(tmp_path):
    figures = roll_under_load(tmp_path, unique_topic("roll"))
    printable = {k: v for k, v in figures.items() if k != "roll_output"}
    print(figures["roll_output"])
    print(json.dumps(printable, indent=1, default=str)[:4000])
    for name, consumer in figures["consumers"].items():
        assert not consumer["lost"], (name, consumer["lost"][:10], len(consumer["lost"]))
        assert not consumer["stored_twice"], (name, consumer["stored_twice"][:10])
    assert len(figures["roll"]) == 3
    for name, producer in figures["producers"].items():
        assert producer["acked"] > 100, (name, producer)
        # Publishing went on after every broker's restart (the gaps' figures are
        # bench.cluster's, not a timed assertion here).
        last_active = max(r["active"] for r in figures["roll"])
        assert producer["last_ack"] > last_active, (name, producer["last_ack"], last_active)
