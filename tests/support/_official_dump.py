"""Dump the official Python client's protobuf file descriptors as JSON on stdout.

Run ONLY with the interpreter of a separate virtualenv that has the official
`danube-client` package installed (its import name, `danube`, clashes with ours), in
isolated mode so that neither PYTHONPATH nor the current directory can put our own
`danube` package first:

    .venv-official/bin/python -I tests/support/_official_dump.py

Output: {"client_version": str, "files": {<proto file name>: {"module": str,
"path": str, "serialized_pb": <base64 FileDescriptorProto>}}}.
"""

import base64
import importlib
import json
import sys

MODULES = ("danube.proto.DanubeApi_pb2", "danube.proto.SchemaRegistry_pb2")


def main():
    try:
        from importlib.metadata import version
        client_version = version("danube-client")
    except Exception:  # pragma: no cover - only for diagnostics
        client_version = "unknown"
    files = {}
    for name in MODULES:
        module = importlib.import_module(name)
        files[module.DESCRIPTOR.name] = {
            "module": name,
            "path": module.__file__,
            "serialized_pb": base64.b64encode(module.DESCRIPTOR.serialized_pb).decode("ascii"),
        }
    json.dump({"client_version": client_version, "files": files}, sys.stdout)


if __name__ == "__main__":
    main()
