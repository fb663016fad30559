"""Protobuf .proto text to descriptors, compiled by protoc in process (see formats).

grpcio-tools' compiler returns generated Python modules rather than descriptor sets; each
embeds its FileDescriptorProto as the one bytes literal passed to AddSerializedFile, which is
read back with `ast` (never executed). Imports resolve against the well-known types shipped
with grpcio-tools only; a schema is one self-contained file."""

import ast
import dataclasses
import os
import threading

from danube.schema.errors import SchemaError

_FILE = "schema.proto"
# protoc keeps process-wide state (its logging, the source tree of one call): one at a time.
_compile_lock = threading.Lock()


@dataclasses.dataclass(frozen=True, eq=False)
class ProtoSchema:
    #: the schema file's FileDescriptorProto.
    file: object
    #: every message of the file and of its imports, by full name with a leading dot (as
    #: FieldDescriptorProto.type_name spells them), to DescriptorProto.
    messages: dict
    #: full name of the message payloads are checked against: the file's first.
    top: str
    #: the FileDescriptorProtos of the file and its imports, imports first.
    files: tuple = ()

    #: message full name -> {number: FieldDescriptorProto}, filled as the checks ask.
    _fields: dict = dataclasses.field(default_factory=dict)

    def fields(self, name):
        """The fields of message `name` by number (built once: the checks ask per pair)."""
        hit = self._fields.get(name)
        if hit is None:
            hit = self._fields[name] = {f.number: f for f in self.messages[name].field}
        return hit

    def file_messages(self):
        """Full names of the schema file's own top-level messages."""
        prefix = "." + self.file.package if self.file.package else ""
        return [f"{prefix}.{m.name}" for m in self.file.message_type]


def load(text):
    import tempfile     # here, as protoc is: only a protobuf schema needs them

    from google.protobuf import descriptor_pb2
    try:
        from grpc_tools import _protoc_compiler
    except ImportError as exc:
        raise SchemaError(f"protobuf schemas need grpcio-tools installed (it holds protoc): "
                          f"{exc}") from None
    include = os.path.join(os.path.dirname(_protoc_compiler.__file__), "_proto")
    with tempfile.TemporaryDirectory(prefix="danube-proto-") as tmp:
        with open(os.path.join(tmp, _FILE), "w", encoding="utf-8") as f:
            f.write(text)
        with _compile_lock:
            try:
                modules = _protoc_compiler.get_protos(
                    _FILE.encode(), [tmp.encode(), include.encode()])
            except _protoc_compiler.ProtocErrors as exc:
                errors = "; ".join(_describe(e) for e in exc.errors())
                raise SchemaError(f"protobuf schema does not parse: {errors}") from None
    files = [descriptor_pb2.FileDescriptorProto.FromString(_serialized(code))
             for _name, code in modules]
    mine = next((f for f in files if f.name == _FILE), None)
    if mine is None:
        raise SchemaError("protobuf schema does not parse: protoc returned no descriptor")
    if not mine.message_type:
        raise SchemaError("protobuf schema defines no message")
    messages = {}
    for f in files:
        prefix = "." + f.package if f.package else ""
        _collect(f.message_type, prefix, messages)
    prefix = "." + mine.package if mine.package else ""
    ordered = tuple(f for f in files if f is not mine) + (mine,)
    return ProtoSchema(mine, messages, f"{prefix}.{mine.message_type[0].name}", ordered)


def _collect(types, prefix, out):
    for m in types:
        name = f"{prefix}.{m.name}"
        out[name] = m
        _collect(m.nested_type, name, out)


def _describe(err):
    def text(v):
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    # protoc counts from 0 here; editors and its own command line count from 1.
    return f"line {err.line + 1}:{err.column + 1}: {text(err.message)}"


def _serialized(code):
    tree = ast.parse(code.decode("utf-8") if isinstance(code, bytes) else code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return ast.literal_eval(node.args[0])
    raise SchemaError("protobuf schema does not parse: no descriptor in protoc's output")
