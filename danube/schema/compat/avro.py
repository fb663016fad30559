"""Avro schema resolution (Avro specification, "Schema Resolution"): can a reader schema read
data written with a writer schema?

- records match by name (unqualified or full) or by a reader alias; fields by name or by a
  reader field alias; a reader field the writer lacks needs a default; writer fields the
  reader lacks are skipped;
- promotions: int to long, float or double; long to float or double; float to double;
  string to bytes and bytes to string;
- enums match by name; a writer symbol the reader lacks is an error unless the reader enum
  has a default;
- fixed match by name and size; arrays by items; maps by values;
- a writer union: every branch must resolve against the reader (the reader's first matching
  branch if the reader is a union); a non-union writer against a reader union: the first
  reader branch that matches;
- logical types are ignored, as the specification says for resolution.
Named references are followed through the schema's own names; a record pair already being
checked higher up is taken as compatible (recursive types)."""

PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes",
                        "string"))
_COMPLEX = frozenset(("record", "error", "enum", "fixed", "array", "map"))
#: writer type to the reader types it promotes to.
_PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"},
               "float": {"double"}, "string": {"bytes"}, "bytes": {"string"}}
_ROLES = {"backward": ("new", "old"), "forward": ("old", "new")}


def can_read(reader, writer, direction="backward"):
    """Problems reading `writer`'s data with `reader` (both AvroSchema); [] when none."""
    ctx = _Ctx(reader.names, writer.names, *_ROLES.get(direction, ("reader", "writer")))
    ctx.resolve(reader.parsed, writer.parsed, "")
    return ctx.problems


class _Ctx:
    def __init__(self, rnames, wnames, rrole, wrole):
        self.rnames, self.wnames = rnames, wnames
        self.r, self.w = rrole, wrole
        self.problems = []
        self.seen = set()

    def fail(self, path, text):
        where = f"field '{path}'" if path else "top level"
        self.problems.append(f"{where}: {text}")

    def resolve(self, reader, writer, path):
        wk, wnode = kind(writer, self.wnames)
        if wk == "union":
            for branch in wnode:
                self.resolve_one(reader, branch, path, in_union=True)
        else:
            self.resolve_one(reader, writer, path)

    def resolve_one(self, reader, writer, path, in_union=False):
        rk, rnode = kind(reader, self.rnames)
        wk, wnode = kind(writer, self.wnames)
        if wk == "union":  # a union nested in a union is not valid Avro; fastavro refuses it
            return self.resolve(reader, writer, path)
        if rk == "union":
            for branch in rnode:
                if self.matches(branch, writer):
                    return self.resolve_one(branch, writer, path)
            what = "a branch of its union" if in_union else "its type"
            return self.fail(path, f"the {self.w} schema writes {describe(wk, wnode)} as "
                                   f"{what}, which no branch of the {self.r} schema's union "
                                   f"reads")
        if rk in PRIMITIVES or wk in PRIMITIVES:
            if rk == wk or rk in _PROMOTIONS.get(wk, ()):
                return
            return self.mismatch(path, rk, rnode, wk, wnode)
        if rk != wk and not (rk in ("record", "error") and wk in ("record", "error")):
            return self.mismatch(path, rk, rnode, wk, wnode)
        if rk not in _COMPLEX:  # a name neither schema defines: fastavro refuses those
            return self.mismatch(path, rk, rnode, wk, wnode)
        if rk in ("record", "error", "enum", "fixed") and not names_match(rnode, wnode):
            return self.fail(path, f"the {self.r} schema reads {describe(rk, rnode)} but the "
                                   f"{self.w} schema writes {describe(wk, wnode)}: names differ")
        getattr(self, "_" + ("record" if rk == "error" else rk))(rnode, wnode, path)

    def mismatch(self, path, rk, rnode, wk, wnode):
        self.fail(path, f"the {self.r} schema's {describe(rk, rnode)} cannot read the "
                        f"{self.w} schema's {describe(wk, wnode)}")

    def matches(self, reader, writer):
        """The specification's union branch selection: same kind (named types by name) or a
        promotion."""
        rk, rnode = kind(reader, self.rnames)
        wk, wnode = kind(writer, self.wnames)
        if rk in PRIMITIVES or wk in PRIMITIVES:
            return rk == wk or rk in _PROMOTIONS.get(wk, ())
        if rk in ("record", "error") and wk in ("record", "error"):
            return names_match(rnode, wnode)
        if rk != wk:
            return False
        return names_match(rnode, wnode) if rk in ("enum", "fixed") else True

    def _record(self, r, w, path):
        key = (id(r), id(w))
        if key in self.seen:
            return
        self.seen.add(key)
        by_name = {f["name"]: f for f in w.get("fields", ())}
        for rf in r.get("fields", ()):
            wf = by_name.get(rf["name"])
            fpath = f"{path}.{rf['name']}" if path else rf["name"]
            if wf is None:
                wf = next((by_name[a] for a in rf.get("aliases", ()) if a in by_name), None)
            if wf is not None:
                rt, wt = rf["type"], wf["type"]
                if rt == wt and _plain(rt):
                    continue  # the common unchanged field: nothing to resolve
                self.resolve(rt, wt, fpath)
            elif "default" not in rf:
                self.fail(fpath, f"the {self.r} schema has no default for it and the "
                                 f"{self.w} schema lacks it")

    def _enum(self, r, w, path):
        missing = [s for s in w.get("symbols", ()) if s not in set(r.get("symbols", ()))]
        if missing and "default" not in r:
            self.fail(path, f"enum {short(r['name'])}: the {self.w} schema's symbols "
                            f"{', '.join(missing)} are unknown to the {self.r} schema, which "
                            f"has no default symbol")

    def _fixed(self, r, w, path):
        if r.get("size") != w.get("size"):
            self.fail(path, f"fixed {short(r['name'])}: size {w.get('size')} in the {self.w} "
                            f"schema, {r.get('size')} in the {self.r} schema")

    def _array(self, r, w, path):
        self.resolve(r["items"], w["items"], f"{path}[]")

    def _map(self, r, w, path):
        self.resolve(r["values"], w["values"], f"{path}{{}}")


def kind(node, names):
    """(type name, node) with named references followed; unions come back as ("union",
    branches)."""
    while True:
        if isinstance(node, list):
            return "union", node
        if isinstance(node, str):
            if node in PRIMITIVES:
                return node, None
            if node in names:
                node = names[node]
                continue
            return node, None
        t = node.get("type")
        if isinstance(t, str) and (t in PRIMITIVES or t in _COMPLEX):
            return t, (node if t in _COMPLEX else None)
        node = t


def _plain(node):
    """Whether `node` is a primitive, or a union of primitives, whose equality settles it."""
    if type(node) is str:
        return node in PRIMITIVES
    if type(node) is not list:
        return False
    for branch in node:  # a loop: this runs for every field of every version checked
        if type(branch) is not str or branch not in PRIMITIVES:
            return False
    return True


def names_match(r, w):
    rname, wname = r.get("name", ""), w.get("name", "")
    if rname == wname or short(rname) == short(wname):
        return True
    namespace = rname.rpartition(".")[0]
    for alias in r.get("aliases", ()):
        full = alias if "." in alias or not namespace else f"{namespace}.{alias}"
        if full == wname or alias == short(wname):
            return True
    return False


def short(name):
    return name.rpartition(".")[2]


def describe(k, node):
    if node is not None and k in ("record", "error", "enum", "fixed"):
        return f"{k} {short(node.get('name', ''))}"
    return k
