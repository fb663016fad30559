# cython: language_level=3
# Avro binary datums checked against a schema in C, for payload validation on the publish
# path: a schema is compiled once into a graph of nodes, and a payload is walked through it
# without building any value (fastavro's reader makes a dict per record, which costs more
# than the rest of a publish). A payload is valid when it is exactly one datum: every
# varint well formed and in range, every length within the payload, strings UTF-8, enum
# indexes and union branches in range, booleans 0 or 1, nothing left after the datum.
#
# Logical types are checked as their underlying type (a decimal's bytes, a uuid's string).

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t, uint64_t

from danube.codec.utf8 cimport utf8_valid

cdef enum:
    _NULL = 0
    _BOOLEAN
    _INT
    _LONG
    _FLOAT
    _DOUBLE
    _BYTES
    _STRING
    _FIXED
    _ENUM
    _ARRAY
    _MAP
    _UNION
    _RECORD

_PRIMITIVES = {"null": _NULL, "boolean": _BOOLEAN, "int": _INT, "long": _LONG,
               "float": _FLOAT, "double": _DOUBLE, "bytes": _BYTES, "string": _STRING}
# Nested deeper than this, a datum is refused rather than risk the C stack (a recursive
# schema, e.g. a linked list, can nest as deep as its data).
DEF _MAX_DEPTH = 200


cdef inline bint _varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int max_bytes,
                         int64_t *out) noexcept nogil:
    # Zig-zag varint of at most max_bytes (5 for int, 10 for long).
    cdef uint64_t v = 0
    cdef int shift = 0, n = 0
    cdef uint8_t b
    while pos[0] < end and n < max_bytes:
        b = p[pos[0]]
        pos[0] += 1
        n += 1
        v |= <uint64_t>(b & 0x7F) << shift
        if b < 0x80:
            if max_bytes == 5 and v > <uint64_t>0xFFFFFFFFULL:
                return False
            out[0] = <int64_t>(v >> 1) ^ -<int64_t>(v & 1)
            return True
        shift += 7
    return False


cdef class AvroChecker:
    """``AvroChecker(parsed)`` for a schema as fastavro.parse_schema returns it (or the
    plain JSON value); ``first_invalid(payloads)`` is the index of the first payload that is
    not exactly one datum of the schema, or -1."""

    cdef list _kind
    cdef list _args          # per node: size (fixed), count (enum), child, or [children]
    cdef int[:] _k
    cdef int[:] _a
    cdef int[:] _list_start
    cdef int[:] _list_len
    cdef int[:] _list

    def __init__(self, schema):
        self._kind = []
        self._args = []
        named = {}
        self._compile(schema, named, "")
        # Flatten into int arrays the walk reads without touching Python objects.
        import array
        kinds, args, starts, lens, flat = [], [], [], [], []
        for kind, arg in zip(self._kind, self._args):
            kinds.append(kind)
            if isinstance(arg, list):
                starts.append(len(flat))
                lens.append(len(arg))
                flat.extend(arg)
                args.append(0)
            else:
                starts.append(0)
                lens.append(0)
                args.append(arg)
        self._k = array.array("i", kinds)
        self._a = array.array("i", args)
        self._list_start = array.array("i", starts)
        self._list_len = array.array("i", lens)
        self._list = array.array("i", flat or [0])

    def _node(self, kind, arg=0):
        self._kind.append(kind)
        self._args.append(arg)
        return len(self._kind) - 1

    def _compile(self, schema, named, namespace):
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return self._node(_PRIMITIVES[schema])
            for name in (schema, f"{namespace}.{schema}" if namespace else schema):
                if name in named:
                    return named[name]
            raise ValueError(f"unknown Avro type {schema!r}")
        if isinstance(schema, list):
            node = self._node(_UNION, [])
            self._args[node] = [self._compile(s, named, namespace) for s in schema]
            return node
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):
            return self._compile(kind, named, namespace)
        if kind in _PRIMITIVES:
            return self._node(_PRIMITIVES[kind])
        if kind == "array":
            node = self._node(_ARRAY)
            self._args[node] = self._compile(schema["items"], named, namespace)
            return node
        if kind == "map":
            node = self._node(_MAP)
            self._args[node] = self._compile(schema["values"], named, namespace)
            return node
        name = schema.get("name", "")
        space = schema.get("namespace", namespace)
        full = name if "." in name or not space else f"{space}.{name}"
        inner = full.rpartition(".")[0]
        if kind == "fixed":
            node = named[full] = self._node(_FIXED, int(schema["size"]))
            return node
        if kind == "enum":
            node = named[full] = self._node(_ENUM, len(schema["symbols"]))
            return node
        if kind in ("record", "error"):
            node = named[full] = self._node(_RECORD, [])
            if name and "." not in name:
                named.setdefault(name, node)
            self._args[node] = [self._compile(f["type"], named, inner)
                                for f in schema["fields"]]
            return node
        if isinstance(kind, str):
            return self._compile(kind, named, namespace)        # a named type's reference
        raise ValueError(f"unsupported Avro type {kind!r}")

    cdef bint _walk(self, const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int node,
                    int depth) noexcept:
        cdef int kind = self._k[node], i, n
        cdef int64_t v, count, size
        if depth > _MAX_DEPTH:
            return False
        if kind == _NULL:
            return True
        if kind == _BOOLEAN:
            if pos[0] >= end or p[pos[0]] > 1:
                return False
            pos[0] += 1
            return True
        if kind == _INT:
            return _varint(p, end, pos, 5, &v)
        if kind == _LONG:
            return _varint(p, end, pos, 10, &v)
        if kind == _FLOAT or kind == _DOUBLE or kind == _FIXED:
            size = 4 if kind == _FLOAT else 8 if kind == _DOUBLE else self._a[node]
            if end - pos[0] < size:
                return False
            pos[0] += size
            return True
        if kind == _BYTES or kind == _STRING:
            if not _varint(p, end, pos, 10, &size) or size < 0 or size > end - pos[0]:
                return False
            if kind == _STRING and not utf8_valid(p + pos[0], <Py_ssize_t>size):
                return False
            pos[0] += size
            return True
        if kind == _ENUM:
            return _varint(p, end, pos, 5, &v) and 0 <= v < self._a[node]
        if kind == _UNION:
            if not _varint(p, end, pos, 5, &v) or v < 0 or v >= self._list_len[node]:
                return False
            return self._walk(p, end, pos, self._list[self._list_start[node] + v], depth + 1)
        if kind == _RECORD:
            n = self._list_len[node]
            for i in range(n):
                if not self._walk(p, end, pos, self._list[self._list_start[node] + i],
                                  depth + 1):
                    return False
            return True
        if kind == _ARRAY or kind == _MAP:
            while True:
                if not _varint(p, end, pos, 10, &count):
                    return False
                if count == 0:
                    return True
                if count < 0:
                    # A negative count is followed by the block's size in bytes.
                    count = -count
                    if not _varint(p, end, pos, 10, &size) or size < 0:
                        return False
                for i in range(count):
                    if kind == _MAP:
                        if not _varint(p, end, pos, 10, &size) or size < 0 \
                                or size > end - pos[0] or not utf8_valid(p + pos[0], size):
                            return False
                        pos[0] += size
                    if not self._walk(p, end, pos, self._a[node], depth + 1):
                        return False
                    if pos[0] > end:
                        return False
        return False

    def valid(self, bytes payload not None):
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(payload)
        cdef Py_ssize_t end = PyBytes_GET_SIZE(payload), pos = 0
        return self._walk(p, end, &pos, 0, 0) and pos == end

    def first_invalid(self, list payloads):
        cdef Py_ssize_t i, pos, end
        cdef const uint8_t *p
        cdef object payload
        for i in range(len(payloads)):
            payload = payloads[i]
            if type(payload) is not bytes:
                payload = bytes(payload)
            p = <const uint8_t *>PyBytes_AS_STRING(payload)
            end = PyBytes_GET_SIZE(payload)
            pos = 0
            if not self._walk(p, end, &pos, 0, 0) or pos != end:
                return i
        return -1
