"""The systemd unit of deploy/systemd/ and the broker's signals:

- the unit passes `systemd-analyze verify` (with ExecStart pointing at this installation's
  `danube`), and, parsed, its ExecStart is a command line `danube broker` accepts with the
  shipped example config (deploy/systemd/danube_broker.yml), its stop signal is SIGTERM
  with more time than the broker's stop takes, its reload sends SIGHUP;
- what the unit assumes of the broker, on real processes: SIGHUP does not stop it (it
  reloads the TLS certificate: tests/e2e/test_security_tls.py), and SIGTERM hands its
  topics over and exits 0 well before the lease would have moved them, with every
  acknowledged message still delivered.
"""

import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_clients import ResilientConsumer, ResilientProducer
from cluster_failover import owner
from cluster_process import etcd_cluster
from danube.cli.main import build_parser
from danube.cluster.node import RELEASE_UPLOAD_TIMEOUT
from danube.config import apply_overrides, load_config
from official_client import unique_topic
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "danube-broker.service"
EXAMPLE = ROOT / "deploy" / "systemd" / "danube_broker.yml"
INSTALLED = "/opt/danube/.venv/bin/danube"
LEASE = 30          # a lease no graceful stop waits for
STOP_GRACE = 10     # Broker.stop's grace for the servers


def parse_unit(text):
    """{section: {key: [values]}} of a unit file (the subset units use: sections, key=value,
    comments, no line continuations)."""
    sections, current = {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            assert line.endswith("]"), raw
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"not key=value: {raw!r}"
        key, value = (part.strip() for part in line.split("=", 1))
        current.setdefault(key, []).append(value)
    return sections


def seconds(value):
    m = re.fullmatch(r"(\d+)(s|min)?", value)
    assert m, value
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    danube = shutil.which("danube", path=str(Path(sys.executable).parent))
    unit = tmp_path / "danube-broker.service"
    unit.write_text(UNIT.read_text().replace(INSTALLED, danube))
    if analyze is None:
        parse_unit(unit.read_text())       # the parser's checks stand in
        return
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    complaints = [line for line in (result.stdout + result.stderr).splitlines()
                  if "danube-broker.service" in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


def test_unit_matches_the_broker():
    service = parse_unit(UNIT.read_text())["Service"]
    command = shlex.split(service["ExecStart"][0])
    assert command[0] == INSTALLED and command[1] == "broker"
    argv = [a for a in command[1:] if a != "$DANUBE_BROKER_ARGS"]
    assert len(argv) == len(command) - 2, "per-VM flags come from $DANUBE_BROKER_ARGS"
    args = build_parser().parse_args(argv + ["--advertised-addr", "10.0.0.11:6650"])
    assert args.mode == "cluster" and args.data_dir == "/var/lib/danube"
    assert service["StateDirectory"] == ["danube"]      # that data directory, made by systemd
    # The shipped example config is one the broker loads, with the unit's flags on top.
    cfg = apply_overrides(load_config(str(EXAMPLE)), args)
    assert cfg.etcd_endpoints and cfg.advertised_broker_url == "http://10.0.0.11:6650"
    assert args.config_file == "/etc/danube/danube_broker.yml"
    # Signals: SIGTERM stops (and drains), with the time the broker's stop may take;
    # reload is SIGHUP.
    assert service["KillSignal"] == ["SIGTERM"]
    assert seconds(service["TimeoutStopSec"][0]) >= RELEASE_UPLOAD_TIMEOUT + STOP_GRACE
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["Restart"] == ["on-failure"]    # a SIGTERM'd broker exits 0: not restarted


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with etcd_cluster(tmp_path_factory, n=2, lease=LEASE) as brokers:
        yield brokers


def test_sighup_keeps_serving_and_sigterm_hands_topics_over(cluster):
    topic = unique_topic("sigterm")
    producer = ResilientProducer(cluster, topic)
    producer.go.clear()
    producer.start()
    consumer = ResilientConsumer(cluster, topic)
    try:
        wait_for(lambda: producer.reconnects, timeout=30, what="the producer created")
        consumer.start()
        wait_for(lambda: consumer.reconnects, timeout=30, what="the consumer subscribed")
        producer.go.set()
        wait_for(lambda: len(consumer.received) >= 50, timeout=30, what="messages flowing")
        victim = owner(cluster, topic)
        survivor = next(b for b in cluster.live if b is not victim)

        victim.proc.send_signal(signal.SIGHUP)     # systemctl reload
        assert victim.wait_for_log("SIGHUP ignored: no TLS to reload")
        acked = len(producer.acked)
        wait_for(lambda: len(producer.acked) >= acked + 50, what="publishing after SIGHUP")
        assert victim.proc.poll() is None

        stopped, stopped_wall = time.monotonic(), time.time()       # systemctl stop
        assert victim.stop(signal.SIGTERM, timeout=LEASE) == 0, victim.log()[-3000:]
        took = time.monotonic() - stopped

        def via_survivor():
            return [t for t, addr in list(producer.acked_via)
                    if t > stopped_wall and addr == survivor.client_addr]
        wait_for(lambda: len(via_survivor()) >= 50, timeout=LEASE,
                 what="publishing again on the other broker")
        served_again = via_survivor()[0] - stopped_wall
        producer.stop()
        wait_for(lambda: consumer.has_all(producer.acked), timeout=30,
                 what="every acknowledged message at the consumer")
    finally:
        producer.stop()
        consumer.stop()
    print(f"SIGTERM: broker exited 0 after {took:.2f} s; first acked publish on the other "
          f"broker {served_again:.2f} s after the signal (lease {LEASE} s)")
    assert "could not deregister" not in victim.log()
    assert f"serving topic {topic}" in survivor.log()
    # Handed over, not failed over: well before the lease could have run out.
    assert served_again < LEASE, served_again
