"""The single `danube` executable built by PyInstaller from packaging/ runs a broker."""

import os
import shutil
import subprocess
import sys

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from broker_process import BrokerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def executable(tmp_path_factory):
    pyinstaller = shutil.which("pyinstaller", path=os.path.dirname(sys.executable))
    if pyinstaller is None:
        pytest.fail("pyinstaller is not installed; the test extras (pip install .[test]) have it")
    work = tmp_path_factory.mktemp("pyinstaller")
    subprocess.run([pyinstaller, "--noconfirm", "--distpath", str(work / "dist"),
                    "--workpath", str(work / "build"), os.path.join(ROOT, "packaging", "danube.spec")],
                   check=True, capture_output=True, timeout=600)
    return str(work / "dist" / "danube")


def test_executable_runs_a_broker(executable, tmp_path):
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("danube ")
    broker = BrokerProcess(data_dir=tmp_path / "data")
    broker.command = [executable, "broker"]
    broker.start()
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            check = ch.unary_unary("/danube.HealthCheck/HealthCheck",
                                   request_serializer=pb.HealthCheckRequest.SerializeToString,
                                   response_deserializer=pb.HealthCheckResponse.FromString)
            assert check(pb.HealthCheckRequest(id=1), timeout=10).status == pb.HealthCheckResponse.CLOSE
    finally:
        assert broker.stop() == 0
