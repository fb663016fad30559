"""Checks of how a package's classes are put together, shared by the shape tests
(test_core_shape.py, test_wal_shape.py): composed, not mixed."""

import ast
import importlib
import inspect
import pathlib
import textwrap


def private_reaches(source):
    """[(line, text)] of every ``x._name`` whose ``x`` is not ``self`` (or ``cls``), and of
    every private name imported from a danube module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__") and \
                not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("danube."):
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                         if alias.name.startswith("_") and not alias.name.startswith("__"))
    return sorted(found)


def statements(function):
    """The statements of ``function``'s body, its docstring left out."""
    body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0].body
    return [s for s in body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]


def package_classes(directory: pathlib.Path, package: str):
    """Every class defined in the modules of ``package`` (its files in ``directory``)."""
    out = []
    for path in sorted(directory.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"{package}.{path.stem}")
        out += [cls for cls in vars(module).values()
                if inspect.isclass(cls) and cls.__module__ == module.__name__]
    return out


def longer_than_one_statement(cls, lifecycle):
    """The members of facade class ``cls`` (methods, property getters and setters,
    classmethods) other than ``lifecycle``'s that are more than one statement."""
    long = []
    for name, member in vars(cls).items():
        if isinstance(member, property):
            functions = [member.fget, member.fset]
        elif isinstance(member, classmethod):
            functions = [member.__func__]
        else:
            functions = [member]
        for function in functions:
            if name in lifecycle or not inspect.isfunction(function):
                continue
            if len(statements(function)) != 1:
                long.append(name)
    return long


def shared_tables(parts, kinds):
    """Given {part name: its fields}, the groups of fields (``part.field``) that hold one
    and the same object of ``kinds``: a table should have one owner."""
    owners = {}
    for part, fields in parts.items():
        for name, value in fields.items():
            if isinstance(value, kinds):
                owners.setdefault(id(value), []).append(f"{part}.{name}")
    return [names for names in owners.values() if len(names) > 1]
