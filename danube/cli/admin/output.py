"""Printing for `danube admin`: JSON as upstream's serde_json::to_string_pretty writes it,
aligned tables, and readable byte counts and rates."""

import json

from google.protobuf.descriptor import FieldDescriptor


def emit_json(value):
    print(json.dumps(value, indent=2, ensure_ascii=False))


def table(headers, rows, min_widths=(), indent=""):
    """Print ``rows`` under ``headers``, each column as wide as its widest cell (and at least
    ``min_widths``, upstream's fixed widths), with a rule under the header."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    widths = [max(w, m) for w, m in zip(widths, [*min_widths, *[0] * len(widths)])]
    line = " ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()
    print(indent + line)
    print(indent + "-" * len(line))
    for row in cells:
        print(indent + " ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def debug_list(strings):
    """Rust's `{:?}` of a Vec<String>, which upstream prints: ["a", "b"]."""
    return "[" + ", ".join(json.dumps(s, ensure_ascii=False) for s in strings) + "]"


def optional(message, field):
    """A proto3 `optional` field's value, or None when unset (serde's null)."""
    return getattr(message, field) if message.HasField(field) else None


def proto_to_dict(message):
    """Every field of ``message`` under its proto name, integers as JSON numbers (protobuf's
    own JSON mapping writes 64-bit integers as strings), unset optional fields as null."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        is_message = field.type == FieldDescriptor.TYPE_MESSAGE
        if _is_repeated(field):
            out[field.name] = [proto_to_dict(v) if is_message else v for v in value]
        elif (is_message or field.has_presence) and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = proto_to_dict(value) if is_message else value
    return out


def _is_repeated(field):
    is_repeated = getattr(field, "is_repeated", None)   # protobuf >= 5.28; `label` goes later
    if is_repeated is not None:
        return is_repeated
    return field.label == FieldDescriptor.LABEL_REPEATED


def size(count):
    """1536 -> "1.5 KiB"."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def rate(value, unit="msg/s"):
    return f"{value:.1f} {unit}"
