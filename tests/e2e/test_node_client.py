"""A real Node.js client (@grpc/grpc-js with @grpc/proto-loader, whose protobufjs decoder
does not merge a repeated embedded message) loading protocol/DanubeApi.proto: it produces
reliably, receives and acks. Before canonical delivery it saw an empty msg_id.topic_name and
every ack failed with "topic  not found".

bin/test installs the two packages into .ci-tools/. A missing node or package fails the test
(a skip would let the suite pass without this client ever having run)."""

import json
import os
import shutil
import subprocess

import pytest

from broker_process import BrokerProcess

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(TESTS))
NODE_MODULES = os.path.join(REPO, ".ci-tools", "node_modules")
SCRIPT = os.path.join(REPO, "tests", "support", "node_scripts", "reliable_roundtrip.js")
PROTO = os.path.join(REPO, "protocol", "DanubeApi.proto")
PACKAGES = ("@grpc/grpc-js", "@grpc/proto-loader")


def node():
    """The node binary, once the packages are there; fails the test otherwise."""
    missing = [p for p in PACKAGES
               if not os.path.exists(os.path.join(NODE_MODULES, p, "package.json"))]
    binary = shutil.which("node")
    if binary is None:
        missing.insert(0, "node (Node.js)")
    if missing:
        message = (f"missing {', '.join(missing)}: run `bash bin/test` (it installs the "
                   "packages with npm into .ci-tools/)")
        pytest.fail(message, pytrace=False)
    return binary


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("node") / "d").start()
    yield b
    b.stop()


def test_node_client_receives_and_acks_reliable_messages(broker):
    binary = node()
    topic, count = "/default/node-reliable", 5
    args = {"url": broker.client_addr, "proto": PROTO, "topic": topic, "count": count}
    proc = subprocess.run([binary, SCRIPT, json.dumps(args)], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, NODE_PATH=NODE_MODULES))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    got = result["messages"]
    assert [m["payload"] for m in got] == [f"node-{i}" for i in range(count)]
    assert [m["attributes"] for m in got] == [{"index": str(i), "lang": "js"}
                                              for i in range(count)]
    assert [m["topic_name"] for m in got] == [topic] * count
    assert [m["broker_addr"] for m in got] == [f"http://{broker.client_addr}"] * count
    assert [int(m["topic_offset"]) for m in got] == list(range(count))
    assert [int(m["request_id"]) for m in got] == list(range(1, count + 1))
    assert {m["producer_id"] for m in got} == {result["producer_id"]}
    assert {m["producer_name"] for m in got} == {"node-producer"}
    assert result["acks"] == [{"ok": True}] * count
