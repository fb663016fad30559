"""The single `danube` executable built by PyInstaller from packaging/ (issue 25): it runs the
broker, produce, consume, admin (also as danube-admin) and schema against each other with no
Python environment on its path, and the hostile-client suites pass against it too."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from broker_process import EXECUTABLE_ENV, BrokerProcess
from cluster_process import ClusterBrokers
from etcd_process import EtcdProcess
from executable_cache import ExecutableCache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The attack suites of the hardening issue (17), run again with the executable as the broker.
ATTACK_SUITES = ["tests/e2e/test_rpc_hostile_conn.py", "tests/e2e/test_rpc_hostile_stream.py",
                 "tests/e2e/test_hostile_requests.py", "tests/e2e/test_oversize_publish.py"]

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def executable(tmp_path_factory):
    """packaging/danube.spec built from the installed package. The build (~45 core-s, the
    suite's longest single step) is kept, as ccache keeps compiles, under the hash of all
    that goes into it (executable_cache.build_key); DANUBE_REBUILD_EXECUTABLE=1 builds
    anew."""
    pyinstaller = shutil.which("pyinstaller", path=os.path.dirname(sys.executable))
    if pyinstaller is None:
        pytest.fail("pyinstaller is not installed; the test extras (pip install .[test]) have it")
    cache = ExecutableCache(os.path.join(ROOT, "packaging"))
    if not os.environ.get("DANUBE_REBUILD_EXECUTABLE"):
        built = cache.lookup()
        if built is not None:
            return built
    work = tmp_path_factory.mktemp("pyinstaller")
    subprocess.run([pyinstaller, "--noconfirm", "--distpath", str(work / "dist"),
                    "--workpath", str(work / "build"),
                    os.path.join(ROOT, "packaging", "danube.spec")],
                   check=True, capture_output=True, timeout=900)
    return cache.keep(work / "dist" / "danube")


@pytest.fixture
def bare(tmp_path):
    """Run the executable as on a VM: no virtual environment, no PYTHONPATH, a bare PATH,
    an empty working directory."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}

    def run(*argv, timeout=60, check=True):
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                           env=env, cwd=home)
        if check:
            assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
        return r
    run.env = env
    run.home = home
    return run


@pytest.fixture
def broker(executable, bare, tmp_path):
    b = BrokerProcess(data_dir=tmp_path / "data")
    # env -i: nothing of the test's environment (the virtualenv's PATH) reaches the broker
    b.command = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in bare.env.items()),
                 executable, "broker"]
    b.start(timeout=90)
    yield b
    assert b.stop() == 0


def test_version_and_size(executable, bare):
    r = bare(executable, "--version")
    assert r.stdout.startswith("danube ")
    # Reported in README (size and start-up); a bound that catches an accidental doubling.
    assert os.path.getsize(executable) < 120 * 1024 * 1024


def test_produce_consume_admin_and_schema_from_the_executable(executable, bare, broker):
    exe = executable
    service = f"http://{broker.client_addr}"
    admin = ("--endpoint", f"http://{broker.admin_addr}")
    topic = "/default/packaged"
    r = bare(exe, "produce", "-s", service, "-t", topic, "-m", "first", "--reliable")
    assert "sent successfully" in r.stdout

    consumer = subprocess.Popen(
        [exe, "consume", "-s", service, "-t", topic, "-m", "pkg-sub", "--count", "3",
         "--timeout", "60", "--output", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=bare.env,
        cwd=bare.home)
    try:
        # a new reliable subscription starts at the live tail: publish until it has three
        for _ in range(60):
            if consumer.poll() is not None:
                break
            bare(exe, "produce", "-s", service, "-t", topic, "-m", "hello", "--reliable")
        out, err = consumer.communicate(timeout=60)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, err
    received = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(received) == 3 and all("hello" in json.dumps(m) for m in received)

    listed = json.loads(bare(exe, "admin", *admin, "topics", "list", "--namespace", "default",
                             "--output", "json").stdout)
    assert topic in json.dumps(listed)
    assert "Cluster_Leader" in bare(exe, "admin", *admin, "brokers", "list").stdout

    # installed under upstream's names, the same file is danube-admin, danube-cli and
    # danube-broker (packaging/build.sh makes these links)
    link = bare.home / "danube-admin"
    os.symlink(exe, link)
    r = bare(str(link), *admin, "brokers", "list")
    assert "Cluster_Leader" in r.stdout
    for name, expect in (("danube-cli", "usage: danube-cli"), ("danube-broker", "--broker-addr")):
        os.symlink(exe, bare.home / name)
        assert expect in bare(str(bare.home / name), "--help").stdout
    r = bare(str(bare.home / "danube-cli"), "produce", "-s", service, "-t", topic, "-m", "cli",
             "--reliable")
    assert "sent successfully" in r.stdout

    schema = bare.home / "orders.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"id": {"type": "integer"}},
                                  "required": ["id"]}))
    bare(exe, "schema", "-s", service, "register", "orders", "-t", "json_schema", "-f",
         str(schema))
    assert "orders" in bare(exe, "schema", "-s", service, "list").stdout
    r = bare(exe, "produce", "-s", service, "-t", "/default/orders", "--schema-subject",
             "orders", "-m", '{"id": 1}')
    assert "sent successfully" in r.stdout

    token = bare(exe, "admin", "security", "tokens", "create", "--subject", "app",
                 "--secret-key", "k" * 32).stdout.strip()
    assert token.count(".") == 2
    r = bare(exe, "produce", "-s", service, "-t", topic, "-m", "x", "--interval", "oops",
             check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_admin_serve_ui_api_and_mcp_from_the_executable(executable, bare, broker):
    endpoint = f"http://{broker.admin_addr}"
    # the MCP server: JSON-RPC lines on stdin and stdout, as an assistant speaks it
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "list_brokers", "arguments": {}}}]
    mcp = subprocess.Popen([executable, "admin", "serve", "--mode", "mcp",
                            "--broker-endpoint", endpoint],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=bare.env, cwd=bare.home)
    try:
        answers = {}
        for request in requests:
            mcp.stdin.write(json.dumps(request) + "\n")
            mcp.stdin.flush()
            if "id" in request:
                while request["id"] not in answers:
                    line = mcp.stdout.readline()
                    assert line, mcp.stderr.read()
                    message = json.loads(line)
                    if "id" in message:
                        answers[message["id"]] = message
    finally:
        mcp.stdin.close()
        mcp.wait(30)
    assert answers[1]["result"]["serverInfo"]["name"] == "danube-admin"
    assert len(answers[2]["result"]["tools"]) == 58
    assert "Cluster_Leader" in answers[3]["result"]["content"][0]["text"]

    # the /ui/v1 API beside the console
    serve = subprocess.Popen([executable, "admin", "serve", "--listen", "127.0.0.1:0",
                              "--broker-endpoint", endpoint], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=bare.env, cwd=bare.home)
    try:
        line = serve.stdout.readline()
        url = line.split("listening on ")[1].split()[0]
        import urllib.request
        with urllib.request.urlopen(url + "ui/v1/health", timeout=30) as r:
            assert json.load(r) == {"status": "ok", "leader_reachable": True}
    finally:
        serve.send_signal(2)
        assert serve.wait(30) == 0


def test_a_cluster_on_etcd_from_the_executable(executable, bare, tmp_path, monkeypatch):
    """etcd3gw is inside: two brokers of the one file form a cluster on a real etcd."""
    monkeypatch.setenv(EXECUTABLE_ENV, executable)
    etcd = EtcdProcess(tmp_path / "etcd").start()
    cluster = ClusterBrokers(etcd, tmp_path / "cluster")
    try:
        first, second = cluster.start(2).brokers
        status = bare(executable, "admin", "--endpoint", f"http://{first.admin_addr}",
                      "cluster", "status").stdout
        assert "leader" in status.lower()
        for broker in (first, second):
            r = bare(executable, "produce", "-s", f"http://{broker.client_addr}", "-t",
                     "/default/exe-cluster", "-m", "hi", "--reliable")
            assert "sent successfully" in r.stdout
    finally:
        cluster.stop()
        etcd.stop()


def test_attack_suites_against_the_executable(executable):
    env = dict(os.environ, **{EXECUTABLE_ENV: executable})
    r = subprocess.run([sys.executable, "-P", "-m", "pytest", *ATTACK_SUITES, "-q",
                        "-p", "no:cacheprovider", "--benchmark-disable", "-x"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=850)
    assert r.returncode == 0, r.stdout[-5000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
