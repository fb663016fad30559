"""Upstream's executable names: `danube-broker`, `danube-cli` and `danube-admin` as pip
console scripts with upstream's argument conventions, run as real processes against each
other; and the single executable's choice of program by the name it is started under
(packaging/entry.py, run here by Python through links, which is what the frozen file does
without the cost of a PyInstaller build: tests/e2e/test_packaging.py builds that)."""

import json
import os
import subprocess
import sys

import pytest

from broker_process import BrokerProcess
from danube.cli.programs import PROGRAMS, admin_main, broker_main, cli_main, danube_main, \
    main_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
UPSTREAM_BROKER_FLAGS = ("--config-file", "--mode", "--broker-addr", "--admin-addr",
                         "--prom-exporter", "--advertised-addr", "--connect-url",
                         "--raft-addr", "--data-dir", "--seed-nodes", "--join",
                         "--edge-config", "--edge-token")


def run(*argv, check=True, timeout=60):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
    return r


def script(name):
    path = os.path.join(BIN, name)
    assert os.access(path, os.X_OK), f"{name} is not installed next to {sys.executable}"
    return path


def test_main_for_picks_the_program_by_name():
    assert main_for("/usr/local/bin/danube-broker") is broker_main
    assert main_for("danube-cli") is cli_main
    assert main_for("C:\\x\\danube-admin.exe".replace("\\", "/")) is admin_main
    assert main_for("/opt/danube/danube") is danube_main
    assert main_for("anything-else") is danube_main and main_for("") is danube_main
    assert set(PROGRAMS) == {"danube-broker", "danube-cli", "danube-admin"}


def test_danube_broker_takes_upstreams_flags():
    out = run(script("danube-broker"), "--help").stdout
    for flag in UPSTREAM_BROKER_FLAGS:
        assert flag in out, flag
    # Upstream's default mode is cluster, which needs a config file: a clear refusal.
    r = run(script("danube-broker"), check=False)
    assert r.returncode == 2 and "--config-file" in r.stderr and "Traceback" not in r.stderr
    # Upstream's edge mode: its own argument checks (args_parse.rs), each a clear refusal.
    for flags, words in ((("--mode", "edge"), "requires --data-dir"),
                         (("--mode", "edge", "--data-dir", "d"), "requires --edge-config"),
                         (("--mode", "edge", "--join"), "--join")):
        r = run(script("danube-broker"), *flags, check=False)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_danube_cli_has_upstreams_subcommands_only():
    out = run(script("danube-cli"), "--help").stdout
    assert out.startswith("usage: danube-cli")
    for command in ("produce", "consume", "schema"):
        assert command in out
    r = run(script("danube-cli"), "broker", check=False)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_the_three_programs_against_each_other(tmp_path):
    broker = BrokerProcess("--prom-exporter", "127.0.0.1:0", data_dir=tmp_path / "data")
    broker.command = [script("danube-broker")]
    broker.start()
    try:
        service = f"http://{broker.client_addr}"
        topic = "/default/by-upstream-names"
        r = run(script("danube-cli"), "produce", "-s", service, "-t", topic, "-m", "first",
                "--reliable")
        assert "sent successfully" in r.stdout
        consumer = subprocess.Popen(
            [script("danube-cli"), "consume", "-s", service, "-t", topic, "-m", "names",
             "--count", "2", "--timeout", "60", "--output", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # A new subscription starts at the live tail: publish until it has two.
            for _ in range(60):
                if consumer.poll() is not None:
                    break
                run(script("danube-cli"), "produce", "-s", service, "-t", topic, "-m",
                    "hello", "--reliable")
            out, err = consumer.communicate(timeout=60)
        finally:
            consumer.kill()
        assert consumer.returncode == 0, err
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(got) == 2 and all("hello" in json.dumps(m) for m in got)
        admin = ("--endpoint", f"http://{broker.admin_addr}")
        listed = run(script("danube-admin"), *admin, "topics", "list", "--namespace",
                     "default", "--output", "json").stdout
        assert topic in listed
        assert broker.prom_port is not None           # --prom-exporter took effect
    finally:
        assert broker.stop() == 0


@pytest.mark.parametrize("name, expect", [
    ("danube-broker", "--broker-addr"), ("danube-cli", "usage: danube-cli"),
    ("danube-admin", "brokers"), ("danube", "broker")])
def test_the_single_executables_entry_picks_by_link_name(tmp_path, name, expect):
    link = tmp_path / name
    os.symlink(os.path.join(ROOT, "packaging", "entry.py"), link)
    # -P: the repository's danube/ (no compiled modules) must not shadow the installed one.
    r = run(sys.executable, "-P", str(link), "--help")
    assert expect in r.stdout
