"""Protobuf compatibility on the wire: can a reader built from one .proto parse what a writer
built from another serialised? Follows protobuf's guide "Updating A Message Type"; upstream
has no rules yet (its checker says compatible to everything).

Messages are compared from the first message of each file (the one payloads use; its name
may change, names are not on the wire), then through message-typed fields, and also every
other top-level message the two files share by full name. Fields are matched by number:
- a renamed field (same number, compatible type) is compatible;
- types must share an encoding: int32, uint32, int64, uint64, bool and enum are one varint
  family (protobuf's guide: values may be truncated or reinterpreted, never misparsed);
  sint32/sint64; fixed32/sfixed32; fixed64/sfixed64; float; double; a bytes reader reads a
  string or a message writer, but a string reader refuses bytes and a message reader
  refuses bytes (not guaranteed to be UTF-8 or a message); messages recursively;
- repeated reads singular for every type; singular reads repeated for string, bytes and
  messages only (packed numbers do not parse as one value);
- a field the writer lacks reads as its default, unless the reader declares it `required`
  (proto2); a field the reader lacks is kept as an unknown field: removing a field is
  compatible (reserving its number or not). Reusing a number is caught by the type rules
  against every version that still has the old field, and always when the new schema uses
  a number the old one lists as `reserved`.
Enum values, oneof membership and extensions are not compared."""

from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

_ROLES = {"backward": ("new", "old"), "forward": ("old", "new")}
_FAMILY = {
    F.TYPE_INT32: "varint", F.TYPE_UINT32: "varint", F.TYPE_INT64: "varint",
    F.TYPE_UINT64: "varint", F.TYPE_BOOL: "varint", F.TYPE_ENUM: "varint",
    F.TYPE_SINT32: "zigzag", F.TYPE_SINT64: "zigzag",
    F.TYPE_FIXED32: "fixed32", F.TYPE_SFIXED32: "fixed32",
    F.TYPE_FIXED64: "fixed64", F.TYPE_SFIXED64: "fixed64",
    F.TYPE_FLOAT: "float", F.TYPE_DOUBLE: "double",
    F.TYPE_STRING: "string", F.TYPE_BYTES: "bytes", F.TYPE_MESSAGE: "message",
    F.TYPE_GROUP: "group",
}
_DELIMITED = ("string", "bytes", "message")
_TYPE_NAMES = {v: k[5:].lower() for k, v in F.Type.items()}


def can_read(reader, writer, direction="backward"):
    """Problems reading `writer`'s data with `reader` (both ProtoSchema); [] when none."""
    ctx = _Ctx(reader, writer, *_ROLES.get(direction, ("reader", "writer")))
    ctx.message(reader.top, writer.top, _short(reader.top))
    for name in reader.file_messages():
        if name != reader.top and name in writer.file_messages():
            ctx.message(name, name, _short(name))
    return ctx.problems


class _Ctx:
    def __init__(self, reader, writer, rrole, wrole):
        self.reader, self.writer = reader, writer
        self.R, self.W = rrole, wrole
        self.problems = []
        self.seen = set()

    def fail(self, path, text):
        self.problems.append(f"{path}: {text}")

    def message(self, rname, wname, path):
        if (rname, wname) in self.seen:
            return
        self.seen.add((rname, wname))
        rm, wm = self.reader.messages.get(rname), self.writer.messages.get(wname)
        if rm is None or wm is None:
            if rname != wname:
                self.fail(path, f"the {self.W} schema writes message {wname.lstrip('.')} "
                                f"where the {self.R} schema reads {rname.lstrip('.')}")
            return
        rfields, wfields = self.reader.fields(rname), self.writer.fields(wname)
        old, new_fields = (wm, rfields) if self.R == "new" else (rm, wfields)
        reserved = [(r.start, r.end) for r in old.reserved_range]
        for number, f in sorted(new_fields.items()) if reserved else ():
            if any(start <= number < end for start, end in reserved):
                self.fail(f"{path}.{f.name} (field {number})",
                          f"the new schema uses number {number}, which the old schema "
                          f"reserves")
        for number in sorted(rfields):
            rf, wf = rfields[number], wfields.get(number)
            if wf is None:
                if rf.label == F.LABEL_REQUIRED:
                    self.fail(f"{path}.{rf.name} (field {number})",
                              f"required in the {self.R} schema, absent from the {self.W} "
                              f"schema")
                continue
            if rf.type == wf.type and rf.label == wf.label and not rf.type_name:
                continue  # the common unchanged scalar: nothing to compare
            self.field(rf, wf, f"{path}.{rf.name}")

    def field(self, rf, wf, path):
        where = f"{path} (field {rf.number})"
        rfam, wfam = _FAMILY[rf.type], _FAMILY[wf.type]
        if rfam != wfam and not (rfam == "bytes" and wfam in ("string", "message")):
            return self.fail(where, f"type changed: the {self.W} schema writes "
                                   f"{_describe(wf)}, the {self.R} schema reads "
                                   f"{_describe(rf)} (different encodings)")
        rrep, wrep = rf.label == F.LABEL_REPEATED, wf.label == F.LABEL_REPEATED
        if wrep and not rrep and wfam not in _DELIMITED:
            self.fail(where, f"the {self.W} schema writes repeated {_describe(wf)}, which a "
                            f"singular field of the {self.R} schema cannot parse")
        if rfam == wfam == "message" or rfam == wfam == "group":
            self.message(rf.type_name, wf.type_name, path)


def _describe(f):
    return f.type_name.lstrip(".") if f.type in (F.TYPE_MESSAGE, F.TYPE_ENUM) \
        else _TYPE_NAMES.get(f.type, str(f.type))


def _short(name):
    return name.rpartition(".")[2]
