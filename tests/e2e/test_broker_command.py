"""`danube broker` as a process: flags, listening addresses, HealthCheck, metrics, shutdown."""

import re
import signal
import subprocess
import sys
import urllib.request

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from broker_process import BrokerProcess
from grpc_calls import create_producer, send
from ports import free_port


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0", data_dir=tmp_path / "data").start()
    yield b
    b.stop()


def _health(channel):
    return channel.unary_unary("/danube.HealthCheck/HealthCheck",
                               request_serializer=pb.HealthCheckRequest.SerializeToString,
                               response_deserializer=pb.HealthCheckResponse.FromString)


def test_health_check_answers_close_for_unknown_ids(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        check = _health(ch)
        for client in (pb.HealthCheckRequest.Producer, pb.HealthCheckRequest.Consumer):
            resp = check(pb.HealthCheckRequest(request_id=1, client=client, id=12345), timeout=5)
            assert resp.status == pb.HealthCheckResponse.CLOSE


def test_health_check_rejects_invalid_client_type(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        with pytest.raises(grpc.RpcError) as err:
            _health(ch)(pb.HealthCheckRequest(request_id=1, client=7, id=1), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "client type" in err.value.details()
        # The broker keeps serving after bad input.
        resp = _health(ch)(pb.HealthCheckRequest(id=1), timeout=5)
        assert resp.status == pb.HealthCheckResponse.CLOSE


def test_unknown_methods_are_unimplemented_on_both_ports(broker):
    for addr, path in ((broker.client_addr, "/danube.Nope/Nope"),
                       (broker.admin_addr, "/danube_admin.Nope/Nope")):
        with grpc.insecure_channel(addr) as ch:
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary(path)(b"", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_metrics_endpoint_counts_rpcs(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        for _ in range(3):
            _health(ch)(pb.HealthCheckRequest(id=1), timeout=5)
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                  timeout=5).read().decode()
    # upstream's labels (service, method, result, and the broker's id on every series) and
    # our status code
    broker_id = re.search(r'danube_broker_topics_owned\{broker="(\d+)"\}', body).group(1)
    assert (f'danube_broker_rpc_total{{broker="{broker_id}",code="OK",method="health_check",'
            'result="ok",service="health_check"} 3.0' in body)
    # The system topic /system/_events_topic is registered at boot.
    assert f'danube_broker_topics_owned{{broker="{broker_id}"}} 1.0' in body


def test_logs_addresses_and_stops_on_sigterm(broker):
    assert broker.client_port and broker.admin_port and broker.prom_port
    log = broker.log()
    assert f"listening on 127.0.0.1:{broker.client_port}" in log
    assert f"listening on 127.0.0.1:{broker.admin_port}" in log
    assert broker.stop(signal.SIGTERM) == 0
    assert "broker stopped" in broker.log()


def test_stops_on_sigint(tmp_path):
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    assert b.stop(signal.SIGINT) == 0
    assert "broker stopped" in b.log()
    assert (tmp_path / "d").is_dir()


def _run(*args):
    return subprocess.run([sys.executable, "-P", "-m", "danube", "broker", *args],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("args, message", [
    ((), "requires --config-file"),
    (("--mode", "standalone", "--broker-addr", "nonsense"), "--broker-addr: expected HOST:PORT"),
    (("--mode", "standalone", "--admin-addr", "127.0.0.1:99999"),
     "--admin-addr: expected HOST:PORT"),
    (("--mode", "standalone", "--config-file", "/nonexistent/broker.yml"), "--config-file"),
])
def test_bad_flags_exit_with_a_clear_error(args, message):
    result = _run(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_config_file_keys_are_read(tmp_path):
    """The file's ports are the ones listened on and its policy is enforced: a broker that
    ignored the file would listen elsewhere and accept the 2 KiB message."""
    client_port, admin_port = free_port(), free_port()
    cfg = tmp_path / "broker.yml"
    cfg.write_text(f"cluster_name: test\nbroker:\n  host: 127.0.0.1\n  ports:\n"
                   f"    client: {client_port}\n    admin: {admin_port}\n"
                   "policies:\n  max_message_size: 1024\n")
    b = BrokerProcess("--config-file", str(cfg), data_dir=tmp_path / "d")
    b.args = ["--mode", "standalone", "--data-dir", str(tmp_path / "d"), "--config-file", str(cfg)]
    b.start()
    try:
        assert (b.client_port, b.admin_port) == (client_port, admin_port)
        with grpc.insecure_channel(f"127.0.0.1:{client_port}") as ch:
            producer = create_producer(ch, "/default/config-file", "p")
            assert send(ch, "/default/config-file", producer, b"a" * 1000).request_id == 1
            with pytest.raises(grpc.RpcError) as err:
                send(ch, "/default/config-file", producer, b"b" * 2048)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "1024" in err.value.details()
    finally:
        assert b.stop() == 0


def test_port_in_use_is_reported(broker, tmp_path):
    result = _run("--mode", "standalone", "--data-dir", str(tmp_path / "x"),
                  "--broker-addr", broker.client_addr, "--admin-addr", "127.0.0.1:0")
    assert result.returncode == 1
    assert "cannot start" in result.stderr


_HEAP_PROBE = r"""
import ctypes, sys
from danube.process.app import keep_freed_heap
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "tuned":
    assert keep_freed_heap()
# Four 4 MiB batches in flight at once, then freed: what batched publish does.
blocks = [libc.malloc(4 << 20) for _ in range(4)]
for b in blocks:
    ctypes.memset(b, 1, 4 << 20)
for b in blocks:
    libc.free(b)
print(libc.mallinfo2().fordblks)
"""


# A genuine platform skip: mallinfo2 and the malloc tuning it checks are glibc's (Linux).
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_broker_keeps_freed_heap_for_the_next_batches():
    def free_heap(mode):
        out = subprocess.run([sys.executable, "-P", "-c", _HEAP_PROBE, mode], check=True,
                             capture_output=True, text=True)
        return int(out.stdout)
    assert free_heap("default") < 4 << 20          # handed back to the kernel at once
    assert free_heap("tuned") >= 16 << 20          # kept for reuse
