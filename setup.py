"""Build: compiles the Cython hot paths and generates danube/proto/*_pb2.py from protocol/*.proto."""

import glob
import os
import re

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_SRC = os.path.join(HERE, "protocol")
PROTO_OUT = os.path.join(HERE, "danube", "proto")


def generate_protos():
    """Run protoc (from grpcio-tools, a build-time dependency only) over protocol/*.proto."""
    from grpc_tools import protoc
    import grpc_tools

    protos = sorted(glob.glob(os.path.join(PROTO_SRC, "*.proto")))
    if not protos:
        return
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{PROTO_SRC}", f"-I{include}",
            f"--python_out={PROTO_OUT}", f"--pyi_out={PROTO_OUT}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + " ".join(protos))
    # protoc emits top-level imports between generated modules; inside a package they must
    # be relative, or `import DanubeApi_pb2` fails at runtime.
    local = {os.path.splitext(os.path.basename(p))[0] + "_pb2" for p in protos}
    for path in glob.glob(os.path.join(PROTO_OUT, "*_pb2.py*")):
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


class BuildExt(build_ext):
    def run(self):
        if self.inplace:
            generate_protos()
        super().run()


# One extension per .pyx/.pxd pair, at the layer that owns it. They call each other's C
# helpers through cimport; danube/codec is on every include path for _crc32c.h, which
# crc32c.pxd declares and any cimporter compiles in.
EXTENSION_MODULES = [
    "danube.codec.crc32c",
    "danube.codec.http2",
    "danube.codec.grpcframe",
    "danube.codec.msgbatch",
    "danube.broker._canon",
    "danube.broker._fanout",
    "danube.broker._stamp",
    "danube.storage._walframes",
    "danube.storage._tailcache",
]
extensions = [
    Extension(name, [name.replace(".", "/") + ".pyx"], include_dirs=["danube/codec"],
              extra_compile_args=["-O3"])
    for name in EXTENSION_MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
)
