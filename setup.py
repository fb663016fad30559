"""Build: compiles the Cython hot paths and generates danube/proto/*_pb2.py from protocol/*.proto."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_SRC = os.path.join(HERE, "protocol")
PROTO_OUT = os.path.join(HERE, "danube", "proto")


def generate_protos():
    """danube/proto/*_pb2.py (and .pyi) from protocol/*.proto (protocol/compile_protos.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "danube_compile_protos", os.path.join(PROTO_SRC, "compile_protos.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.compile_protos(PROTO_OUT, pyi=True)


class BuildPy(build_py):
    def run(self):
        generate_protos()
        super().run()


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        # The C files compile in parallel, one per core (a fresh clone's install waits on it).
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

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
    "danube.codec.mqtt",
    "danube.broker._canon",
    "danube.broker._columns",
    "danube.broker._fanout",
    "danube.broker._window",
    "danube.broker._stamp",
    "danube.storage._walframes",
    "danube.schema._avrocheck",
    "danube.client._delivery",
    "danube.storage._tailcache",
    "danube.rpc._lone",
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
        nthreads=os.cpu_count() or 1,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
)
