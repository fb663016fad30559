"""Load through an independent HTTP/2 client: nghttp2's h2load against our gRPC server."""

import os
import re
import subprocess

import pytest

from rpc_fixtures import P, grpc_message

H2LOAD = "/usr/bin/h2load"



@pytest.fixture(autouse=True)
def h2load_installed():
    """A missing h2load fails every test here rather than skip it: a skipped module would
    pass CI without the independent client ever having run."""
    if not os.path.exists(H2LOAD):
        pytest.fail(f"{H2LOAD} is not installed: run `bash bin/test` (it installs it with "
                    "`apt-get install nghttp2-client`)", pytrace=False)


def run_h2load(args, timeout=90):
    proc = subprocess.run([H2LOAD, *args], capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def parse(out):
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    assert m, out
    total, started, done, succeeded, failed, errored, timeouts = map(int, m.groups())
    s = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    assert s, out
    t = re.search(r"traffic: .*?\((\d+)\) total, .*?\((\d+)\) headers .*?\((\d+)\) data", out)
    assert t, out
    return {"total": total, "started": started, "done": done, "succeeded": succeeded,
            "failed": failed, "errored": errored, "timeout": timeouts,
            "2xx": int(s.group(1)), "non2xx": sum(int(x) for x in s.groups()[1:]),
            "data_bytes": int(t.group(3))}


GRPC_HEADERS = ["-H", "content-type: application/grpc", "-H", "te: trailers"]


def test_h2load_unary_2000(rpc_server, tmp_path):
    body = tmp_path / "unary.bin"
    body.write_bytes(grpc_message(b"u" * 100))
    svc = rpc_server.service
    before = svc.calls["Unary"]
    out = run_h2load(["-n", "2000", "-c", "2", "-m", "32", "-d", str(body), *GRPC_HEADERS,
                      f"http://{rpc_server.target}{P}Unary"])
    r = parse(out)
    assert r["total"] == r["done"] == r["succeeded"] == 2000, out
    assert r["failed"] == r["errored"] == r["timeout"] == 0, out
    assert r["2xx"] == 2000 and r["non2xx"] == 0, out
    # Every response carried the echoed 100-byte message (5-byte prefix + 100).
    assert r["data_bytes"] == 2000 * 105, out
    assert svc.calls["Unary"] - before == 2000


def test_h2load_server_stream_200k(rpc_server, tmp_path):
    n = 200_000
    body = tmp_path / "stream.bin"
    body.write_bytes(grpc_message(b"%d,1000" % n))
    out = run_h2load(["-n", "1", "-c", "1", "-d", str(body), *GRPC_HEADERS,
                      f"http://{rpc_server.target}{P}BatchStream"])
    r = parse(out)
    assert r["succeeded"] == 1 and r["2xx"] == 1, out
    assert r["data_bytes"] == n * 105, out


def test_h2load_small_windows(rpc_server, tmp_path):
    """A peer with 64 KiB windows (h2load -w 16 -W 16) pulling a 3 MiB response 20 times on
    4 concurrent streams: the server must pace itself by WINDOW_UPDATEs."""
    body = tmp_path / "blob.bin"
    body.write_bytes(grpc_message(b"%d" % (3 << 20)))
    out = run_h2load(["-n", "20", "-c", "1", "-m", "4", "-w", "16", "-W", "16", "-d", str(body),
                      *GRPC_HEADERS, f"http://{rpc_server.target}{P}Blob"])
    r = parse(out)
    assert r["succeeded"] == 20 and r["2xx"] == 20, out
    assert r["data_bytes"] == 20 * ((3 << 20) + 5), out
