"""JSON Schema compatibility by structural rules: can a consumer holding the reader schema
read the data a producer holding the writer schema writes?

The model treats an object schema as a record whose declared properties are its fields:
- data written with a schema carries its required properties, may carry its optional ones,
  and carries nothing else that the reader would misread (undeclared extra properties of an
  open schema are assumed not to collide with properties another version declares);
- a property the reader requires must be required by the writer, or have a default in the
  reader ("added required field without a default", "made optional field required");
- a property the writer requires is data the writer guarantees; a reader that neither
  declares it nor takes it through an `additionalProperties` schema would silently drop it,
  which counts as incompatible ("removed required field" / "added new required field", as in
  upstream's scenarios); a writer's optional property the reader does not declare is ignored,
  unless the reader forbids additional properties;
- values the writer allows must be allowed by the reader: `type` (integer widens to number,
  nothing narrows), `enum`/`const`, bounds (minimum, maximum, exclusive bounds, multipleOf,
  minLength, maxLength, pattern, format, minItems, maxItems, uniqueItems, minProperties,
  maxProperties), array `items` and object properties recursively;
- `anyOf`/`oneOf`: every writer branch must be readable by some reader branch; `allOf`,
  `not`, `if`/`then`/`else`, tuple `items`/`prefixItems` are compared only for equality;
- local `$ref`s (`#...` JSON pointers) are followed; other refs must be equal.
See docs/schema-compatibility.md for the table of rules and their tests."""

import json

_ROLES = {"backward": ("new", "old"), "forward": ("old", "new")}
#: Nesting beyond this is reported rather than followed (Python's recursion limit).
_MAX_DEPTH = 150
_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_EQUAL = ("pattern", "format")
_CATEGORY = {"minimum": "number", "exclusiveMinimum": "number", "maximum": "number",
             "exclusiveMaximum": "number", "multipleOf": "number", "minLength": "string",
             "maxLength": "string", "pattern": "string", "format": "string",
             "minItems": "array", "maxItems": "array", "uniqueItems": "array",
             "minProperties": "object", "maxProperties": "object"}
_ONLY_EQUAL = ("allOf", "not", "if", "then", "else", "prefixItems", "dependentRequired",
               "dependentSchemas", "propertyNames", "patternProperties")


def can_read(reader, writer, direction="backward"):
    """Problems reading `writer`'s data with `reader` (parsed JSON Schemas); [] when none."""
    ctx = _Ctx(reader, writer, *_ROLES.get(direction, ("reader", "writer")),
               forward=direction == "forward")
    ctx.sub(reader, writer, "")
    return ctx.problems


class _Ctx:
    def __init__(self, rroot, wroot, rrole, wrole, forward):
        self.rroot, self.wroot = rroot, wroot
        self.R, self.W = rrole, wrole
        self.forward = forward
        self.problems = []
        self.seen = set()

    def fail(self, path, text):
        where = f"field '{path}'" if path else "top level"
        self.problems.append(f"{where}: {text}")

    def sub(self, r, w, path):
        r, w = self.deref(r, self.rroot), self.deref(w, self.wroot)
        key = (id(r), id(w))
        if key in self.seen:
            return  # a recursive schema already being compared higher up
        if len(self.seen) > _MAX_DEPTH:
            return self.fail(path, "schemas nest too deeply to compare")
        self.seen.add(key)
        try:
            self.compare(r, w, path)
        finally:
            self.seen.discard(key)

    def compare(self, r, w, path):
        if r is True or r == {} or w is False:
            return
        if r is False:
            return self.fail(path, f"the {self.R} schema accepts no value here")
        if w is True:
            w = {}
        for node in (r, w):
            if "$ref" in node and not node["$ref"].startswith("#"):
                if r.get("$ref") != w.get("$ref"):
                    return self.fail(path, f"$ref {node['$ref']!r} cannot be followed; "
                                           f"the schemas must then name the same $ref")
                return
        for word in _ONLY_EQUAL + (("items",) if _tuple(r) or _tuple(w) else ()):
            if (word in r or word in w) and _canon(r.get(word)) != _canon(w.get(word)):
                self.fail(path, f"'{word}' changed (compared only for equality)")
        w_alts = w.get("anyOf") or w.get("oneOf")
        if w_alts is not None:
            rest = {k: v for k, v in w.items() if k not in ("anyOf", "oneOf")}
            for branch in w_alts:
                self.sub(r, _merge(rest, self.deref(branch, self.wroot)), path)
            return
        r_alts = r.get("anyOf") or r.get("oneOf")
        if r_alts is not None:
            return self.alternatives(r, r_alts, w, path)
        self.types(r, w, path)
        self.values(r, w, path)
        rt, wt = _types(r), _types(w)
        if _may_be(rt, "object") and _may_be(wt, "object"):
            self.objects(r, w, path)
        if _may_be(rt, "array") and _may_be(wt, "array") and not _tuple(r):
            if "items" in r or "items" in w:
                self.sub(r.get("items", True), w.get("items", True), f"{path}[]")

    def alternatives(self, r, r_alts, w, path):
        rest = {k: v for k, v in r.items() if k not in ("anyOf", "oneOf")}
        first = None
        for branch in r_alts:
            trial = _Ctx(self.rroot, self.wroot, self.R, self.W, self.forward)
            trial.seen = set(self.seen)
            trial.sub(_merge(rest, self.deref(branch, self.rroot)), w, path)
            if not trial.problems:
                return
            first = first or trial.problems
        self.fail(path, f"no alternative of the {self.R} schema's anyOf/oneOf reads what the "
                        f"{self.W} schema allows: " + "; ".join(first or ()))

    def types(self, r, w, path):
        rt, wt = _types(r), _types(w)
        if rt is None:
            return
        if wt is None:
            return self.fail(path, f"the {self.R} schema narrows the type to "
                                   f"{_list(rt)}; the {self.W} schema allows any type")
        lost = [t for t in sorted(wt) if t not in rt and not (t == "integer" and "number" in rt)]
        if lost:
            self.fail(path, f"changed type of field '{path or '(root)'}': the {self.W} schema "
                            f"allows {_list(lost)}, the {self.R} schema only {_list(rt)}")

    def values(self, r, w, path):
        renum, wenum = _enum(r), _enum(w)
        if renum is not None:
            if wenum is None:
                self.fail(path, f"the {self.R} schema restricts values to "
                                f"{_list(sorted(renum))}; the {self.W} schema does not")
            elif wenum - renum:
                self.fail(path, f"enum values {_list(sorted(wenum - renum))} of the {self.W} "
                                f"schema are not accepted by the {self.R} schema")
        wt = _types(w)
        for word in [k for k in r if k in _CATEGORY]:
            if wt is not None and not _in_category(_CATEGORY[word], wt):
                continue
            rv, wv = r[word], w.get(word)
            if isinstance(rv, bool) and word.startswith("exclusive"):
                continue  # draft-4 boolean flags modify minimum/maximum, compared there
            if word in _LOWER:
                worse = wv is None or (_number(wv) and _number(rv) and wv < rv)
            elif word in _UPPER:
                worse = wv is None or (_number(wv) and _number(rv) and wv > rv)
            elif word == "multipleOf":
                worse = wv is None or not _number(wv) or (wv / rv) != int(wv / rv)
            elif word == "uniqueItems":
                worse = rv is True and wv is not True
            else:
                worse = wv != rv
            if worse:
                self.fail(path, f"the {self.R} schema's {word} {json.dumps(rv)} is stricter "
                                f"than the {self.W} schema's "
                                f"{'(none)' if wv is None else json.dumps(wv)}")

    def objects(self, r, w, path):
        rp, wp = r.get("properties") or {}, w.get("properties") or {}
        rreq, wreq = set(r.get("required") or ()), set(w.get("required") or ())
        radd, wadd = r.get("additionalProperties", True), w.get("additionalProperties", True)
        for name in sorted(rreq):
            prop = rp.get(name)
            if name in wreq or (isinstance(prop, dict) and "default" in prop):
                continue
            self.fail(_join(path, name), self.require_words(name, name in wp))
        for name in sorted(wp):
            fpath = _join(path, name)
            if name in rp:
                if rp[name] == wp[name] and _leaf(rp[name]):
                    continue  # the common unchanged property: it reads itself
                self.sub(rp[name], wp[name], fpath)
            elif radd is False:
                self.fail(fpath, f"the {self.W} schema allows property '{name}', which the "
                                 f"{self.R} schema forbids (additionalProperties false)")
            elif isinstance(radd, dict):
                self.sub(radd, wp[name], fpath)
            elif name in wreq:
                self.fail(fpath, self.drop_words(name))
        for name in sorted(wreq - set(wp) - set(rp)):
            if not isinstance(radd, dict):
                self.fail(_join(path, name), self.drop_words(name))
        if radd is False and wadd is not False:
            self.fail(path, f"the {self.R} schema forbids additional properties, which the "
                            f"{self.W} schema allows")
        elif isinstance(radd, dict) and wadd is not False:
            self.sub(radd, wadd, f"{path}{{additional}}" if path else "{additional}")

    def require_words(self, name, writer_declares):
        if self.forward:  # reader = old, writer = new
            what = (f"made required field '{name}' optional" if writer_declares
                    else f"removed required field '{name}'")
        else:
            what = (f"made optional field '{name}' required" if writer_declares
                    else f"added required field '{name}' without a default")
        return (f"{what}: the {self.R} schema requires it, with no default, and data "
                f"written with the {self.W} schema may lack it")

    def drop_words(self, name):
        what = (f"added new required field '{name}'" if self.forward
                else f"removed required field '{name}'")
        return (f"{what}: the {self.W} schema guarantees it and the {self.R} schema does "
                f"not declare it, so its readers would drop it")

    def deref(self, node, root):
        hops = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) \
                and node["$ref"].startswith("#") and hops < 32:
            target = _pointer(root, node["$ref"][1:])
            if target is None:
                return node
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = _merge(target, rest) if rest and isinstance(target, dict) else target
            hops += 1
        return node


def _types(node):
    """The set of JSON types `node` allows, None for any."""
    t = node.get("type") if isinstance(node, dict) else None
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _leaf(node):
    """Whether `node` holds no subschema (nor $ref), so that it trivially reads itself."""
    if type(node) is not dict:
        return type(node) is bool
    if "$ref" in node:
        return False
    for v in node.values():  # a loop: this runs for every property of every version checked
        t = type(v)
        if t is dict:
            return False
        if t is list:
            for item in v:
                if type(item) in (dict, list):
                    return False
    return True


def _may_be(types, name):
    return types is None or name in types


def _in_category(category, types):
    if category == "number":
        return bool({"number", "integer"} & types)
    return category in types


def _enum(node):
    if "const" in node:
        return {_canon(node["const"])}
    if isinstance(node.get("enum"), list):
        return {_canon(v) for v in node["enum"]}
    return None


def _tuple(node):
    return isinstance(node, dict) and (isinstance(node.get("items"), list)
                                       or "prefixItems" in node)


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _merge(a, b):
    """Both of schemas `a` and `b` (their keywords side by side; b's win a clash), keeping
    the very object when one side adds nothing, so recursion guards still recognise it."""
    if a is False or b is False:
        return False
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    return {**a, **b}


def _pointer(root, pointer):
    node = root
    for token in filter(None, pointer.split("/")):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _canon(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _list(items):
    return ", ".join(str(i) for i in items)


def _join(path, name):
    return f"{path}.{name}" if path else name
