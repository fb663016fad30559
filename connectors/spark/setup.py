"""Build: generates danube_spark/_proto/*_pb2.py from the repository's protocol/*.proto.

The generated modules go into the wheel, so an installed connector needs neither the .proto
files nor grpcio-tools. An sdist built elsewhere carries the generated modules already
(protocol/ is then absent and generation is skipped)."""

import glob
import os
import re

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
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{PROTO_SRC}", f"-I{include}", f"--python_out={PROTO_OUT}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + " ".join(protos))
    # protoc's imports between generated modules are top-level; inside a package they must
    # be relative.
    local = {os.path.splitext(os.path.basename(p))[0] + "_pb2" for p in protos}
    for path in glob.glob(os.path.join(PROTO_OUT, "*_pb2.py")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fixed = re.sub(r"^import (\w+_pb2) as (\w+)$",
                       lambda m: (f"from . import {m.group(1)} as {m.group(2)}"
                                  if m.group(1) in local else m.group(0)),
                       text, flags=re.M)
        if fixed != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(fixed)


class BuildPy(build_py):
    def run(self):
        generate_protos()
        super().run()


setup(cmdclass={"build_py": BuildPy})
