"""Build helper shared by the broker's setup.py and connectors/spark/setup.py: runs protoc
(from grpcio-tools, a build-time dependency only) over this directory's .proto files into a
package directory. Loaded by path from both, so it needs nothing but the standard library and
grpcio-tools."""

import glob
import os
import re


def compile_protos(out_dir, *, pyi=False):
    """Generate ``*_pb2.py`` (and ``.pyi`` with ``pyi``) for every .proto here into
    ``out_dir``; returns the .proto files compiled (none: nothing was generated)."""
    from grpc_tools import protoc
    import grpc_tools

    here = os.path.dirname(os.path.abspath(__file__))
    protos = sorted(glob.glob(os.path.join(here, "*.proto")))
    if not protos:
        return protos
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["protoc", f"-I{here}", f"-I{include}", f"--python_out={out_dir}"]
    if pyi:
        args.append(f"--pyi_out={out_dir}")
    if protoc.main([*args, *protos]) != 0:
        raise RuntimeError("protoc failed on " + " ".join(protos))
    # protoc emits top-level imports between generated modules; inside a package they must
    # be relative, or `import DanubeApi_pb2` fails at runtime.
    local = {os.path.splitext(os.path.basename(p))[0] + "_pb2" for p in protos}
    for path in glob.glob(os.path.join(out_dir, "*_pb2.py*")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fixed = re.sub(r"^import (\w+_pb2) as (\w+)$",
                       lambda m: (f"from . import {m.group(1)} as {m.group(2)}"
                                  if m.group(1) in local else m.group(0)),
                       text, flags=re.M)
        if fixed != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(fixed)
    return protos

