"""Build: generates danube_spark/_proto/*_pb2.py from the repository's protocol/*.proto.

The generated modules go into the wheel, so an installed connector needs neither the .proto
files nor grpcio-tools. An sdist built elsewhere carries the generated modules already
(protocol/ is then absent and generation is skipped)."""

import glob
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_SRC = os.path.normpath(os.path.join(HERE, "..", "..", "protocol"))
PROTO_OUT = os.path.join(HERE, "danube_spark", "_proto")


def generate_protos():
    protos = sorted(glob.glob(os.path.join(PROTO_SRC, "*.proto")))
    if not protos:
        if not glob.glob(os.path.join(PROTO_OUT, "*_pb2.py")):
            raise RuntimeError(f"no .proto files in {PROTO_SRC} and no generated modules")
        return
    # The broker's own build uses the same generator (protocol/compile_protos.py).
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "danube_compile_protos", os.path.join(PROTO_SRC, "compile_protos.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.compile_protos(PROTO_OUT)


class BuildPy(build_py):
    def run(self):
        generate_protos()
        super().run()


setup(cmdclass={"build_py": BuildPy})
