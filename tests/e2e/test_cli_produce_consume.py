"""`danube produce` and `danube consume` as processes against a real broker: upstream
danube-cli's output lines, our JSON output, progress and summary, and clean failures."""

import json
import os
import pty
import signal
import subprocess
import sys

import pytest

from broker_process import BrokerProcess

# -P: the repo's source tree must not shadow the installed package; the environment (and
# with it any PYTHONPATH of an in-place build) is passed through.
CLI = [sys.executable, "-P", "-m", "danube"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("d")).start()
    yield b
    b.stop()


def run(*args, timeout=60):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def produce(broker, topic, *args):
    result = run("produce", "-s", broker.client_addr, "-t", topic, *args)
    assert result.returncode == 0, result.stderr
    return result


class Consumer:
    """A `danube consume` process, started and waited for until it has subscribed."""

    def __init__(self, broker, topic, *args):
        self.proc = subprocess.Popen(
            [*CLI, "consume", "-s", broker.client_addr, "-t", topic, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        self.first_stderr = self.proc.stderr.readline()
        assert "Consuming from" in self.first_stderr, self.finish()

    def finish(self, timeout=30):
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, self.first_stderr + err


def test_produce_then_consume(broker):
    topic = "/default/cli_basic"
    produce(broker, topic, "-m", "Init message", "-c", "1")
    consumer = Consumer(broker, topic, "-m", "test-subscription", "--count", "5",
                        "--timeout", "30")
    result = produce(broker, topic, "-m", "Hello from integration test", "-c", "5",
                     "-i", "100")
    assert "Success: 5" in result.stdout
    assert "Errors:" not in result.stdout
    for i in range(1, 6):
        assert f"📤 Message {i}/5 sent successfully (ID: {i})" in result.stdout
    assert "5 sent, 0 failed" in result.stdout and "msgs/s" in result.stdout
    code, out, err = consumer.finish()
    assert code == 0, err
    assert out.count("Received message: Hello from integration test") == 5
    assert "Size: 27 bytes, Total received: 135 bytes" in out
    assert "Total received:" in out


def test_attributes_are_printed(broker):
    topic = "/default/cli_attrs"
    produce(broker, topic, "-m", "init")
    consumer = Consumer(broker, topic, "-m", "s", "--count", "3", "--timeout", "30")
    result = produce(broker, topic, "-m", "Message with metadata", "-a",
                     "priority:high,source:test", "-c", "3", "-i", "100")
    assert "Success: 3" in result.stdout
    code, out, err = consumer.finish()
    assert code == 0, err
    assert out.count("Attributes: priority=high, source=test") == 3


@pytest.mark.parametrize("sub_type", ["exclusive", "shared"])
def test_subscription_types(broker, sub_type):
    topic = f"/default/cli_{sub_type}"
    produce(broker, topic, "-m", "Init message")
    consumer = Consumer(broker, topic, "-m", f"{sub_type}-sub", "--sub-type", sub_type,
                        "--count", "3", "--timeout", "30")
    produce(broker, topic, "-m", "Test message", "-c", "3", "-i", "100")
    code, out, err = consumer.finish()
    assert code == 0, err
    assert out.count("Received message: Test message") == 3


def test_json_output_both_ways_and_binary_file(broker, tmp_path):
    topic = "/default/cli_json"
    produce(broker, topic, "-m", "init")
    consumer = Consumer(broker, topic, "-m", "s", "--count", "3", "--timeout", "30",
                        "--output", "json")
    result = produce(broker, topic, "-m", "json text", "-a", "k:v", "-c", "2", "-i", "100",
                     "--output", "json")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[:2] == [{"index": 1, "count": 2, "request_id": 1},
                         {"index": 2, "count": 2, "request_id": 2}]
    assert lines[2]["sent"] == 2 and lines[2]["failed"] == 0
    assert set(lines[2]) == {"sent", "failed", "msgs_per_sec", "elapsed_s"}
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\x00binary")
    # -f wins over -m.
    produce(broker, topic, "-f", str(blob), "-m", "ignored", "--output", "json")
    code, out, err = consumer.finish()
    assert code == 0, err
    msgs = [json.loads(line) for line in out.splitlines()]
    assert [m["payload"] for m in msgs[:2]] == ["json text", "json text"]
    first = msgs[0]
    assert first["encoding"] == "utf-8" and first["attributes"] == {"k": "v"}
    assert first["topic"] == topic and first["offset"] == 0
    assert first["producer"] == "test_producer" and first["publish_time"] > 0
    assert msgs[2]["encoding"] == "base64" and msgs[2]["payload"] == "/wBiaW5hcnk="
    assert msgs[2]["size"] == 8


def test_routing_key_per_message_reaches_a_key_shared_consumer(broker):
    topic = "/default/cli_keys"
    produce(broker, topic, "-m", "init")
    consumer = Consumer(broker, topic, "-m", "ks", "--sub-type", "key-shared", "--count", "4",
                        "--timeout", "30", "--output", "json")
    produce(broker, topic, "-m", "keyed", "-c", "3", "-i", "100", "-k", "user-{i}")
    produce(broker, topic, "-m", "fixed", "--routing-key", "zzz", "-c", "1")
    code, out, err = consumer.finish()
    assert code == 0, err
    keys = [json.loads(line).get("routing_key") for line in out.splitlines()]
    assert keys == ["user-1", "user-2", "user-3", "zzz"]


def test_count_summary_without_tty_and_pipeline(broker):
    topic = "/default/cli_count"
    result = produce(broker, topic, "-m", "x", "-c", "300", "--pipeline", "50")
    # Not a terminal: no progress bar; the pipeline prints no per-message lines.
    assert "\r" not in result.stderr and "[#" not in result.stderr
    assert "Message 1/300" not in result.stdout
    assert "Success: 300" in result.stdout
    assert "300 sent, 0 failed" in result.stdout and "msgs/s" in result.stdout
    result = produce(broker, topic, "-m", "x", "-c", "200", "--pipeline", "64",
                     "--output", "json")
    summary = json.loads(result.stdout)
    assert summary["sent"] == 200 and summary["failed"] == 0 and summary["msgs_per_sec"] > 0


def test_progress_bar_on_a_terminal(broker):
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "produce", "-s", broker.client_addr, "-t", "/default/cli_tty", "-m", "x",
         "-c", "500", "--pipeline", "32"],
        stdout=subprocess.PIPE, stderr=slave, env=dict(os.environ))
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:             # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out, _ = proc.communicate(timeout=30)
    bar = b"".join(chunks).decode()
    assert proc.returncode == 0
    assert "500/500" in bar and "msgs/s" in bar and "[" + "#" * 30 + "]" in bar
    assert b"Success: 500" in out


def test_unreachable_broker_is_a_clean_error():
    for args in (["produce", "-m", "x"], ["consume", "-m", "s"]):
        result = run(args[0], "-s", "http://127.0.0.1:1", *args[1:])
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"danube {args[0]}: error:")
        assert "127.0.0.1:1" in lines[0] and "UNAVAILABLE" in lines[0]


def test_reliable_produce_with_attributes(broker):
    # upstream basic_workflow.rs: produce with -a attributes and --reliable, "Success: 3".
    result = run("produce", "-s", broker.client_addr, "-t", "/default/cli_reliable", "-m",
                 "Message with metadata", "-a", "priority:high,source:test", "--reliable",
                 "-c", "3", "-i", "100")
    assert result.returncode == 0, result.stderr
    assert "Success: 3" in result.stdout


def test_producer_strategy_mismatch_reports_the_brokers_refusal(broker):
    topic = "/default/cli_reliable_mismatch"
    assert run("produce", "-s", broker.client_addr, "-t", topic, "-m", "x",
               "--reliable").returncode == 0
    result = run("produce", "-s", broker.client_addr, "-t", topic, "-m", "x")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "FAILED_PRECONDITION" in result.stderr and "dispatch strategy" in result.stderr


def test_argument_rules(broker):
    addr = ["-s", broker.client_addr]
    bad = [
        (["-m", "x", "-i", "50"], "at least 100 milliseconds"),
        ([], "-m/--message or -f/--file"),
        (["-m", "x", "--schema-version", "2"], "require --schema-subject"),
        (["-m", "x", "--schema-subject", "s", "--schema-file", "f"], "not allowed with"),
        (["-m", "x", "--schema-subject", "s", "--schema-version", "1",
          "--schema-min-version", "1"], "not allowed with"),
        (["-m", "x", "-a", "novalue"], "key:value"),
        (["-m", "x", "-k", ""], "--routing-key must not be empty"),
        (["-m", "x", "-k", "u-{i}", "--pipeline", "8"], "does not go with --pipeline"),
    ]
    for args, message in bad:
        result = run("produce", *addr, *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    # Schema flags reach the broker, whose error is reported cleanly.
    result = run("produce", *addr, "-t", "/default/cli_schema", "-m", "x",
                 "--schema-subject", "orders")
    assert result.returncode == 1 and "schema" in result.stderr
    assert "Traceback" not in result.stderr


def test_consume_missing_topic_and_timeout(broker):
    result = run("consume", "-s", broker.client_addr, "-t", "/default/cli_none", "-m", "s")
    assert result.returncode == 1 and "No topics found" in result.stderr
    produce(broker, "/default/cli_timeout", "-m", "init")
    result = run("consume", "-s", broker.client_addr, "-t", "/default/cli_timeout", "-m",
                 "s", "--count", "2", "--timeout", "0.5")
    assert result.returncode == 1 and "received 0 of 2" in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_consumer_stops_cleanly_on_signal(broker, sig):
    topic = "/default/cli_signal"
    produce(broker, topic, "-m", "init")
    consumer = Consumer(broker, topic, "-m", "s")
    produce(broker, topic, "-m", "before the signal")
    # The message is printed (and flushed) before the process is asked to stop.
    assert consumer.proc.stdout.readline().startswith("Received message: before the signal")
    consumer.proc.send_signal(sig)
    code, out, err = consumer.finish(timeout=10)
    assert code == 0, err
    assert "Traceback" not in err
