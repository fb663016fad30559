"""Checks of how a package's classes are put together, shared by the shape tests
(test_core_shape.py, test_wal_shape.py): composed, not mixed."""

import ast
import inspect
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
