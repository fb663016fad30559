"""The storage layer's imports point one way: down to the codec (``danube._wal``), the
bottom modules (config errors and keys, the flock helper) and storage's own modules; never
up to the broker or sideways to metadata, and not to ``danube.config`` (which imports the
storage config to parse ``storage.durable``: that made a loop). Read from the source, so a
lazy import inside a function counts too."""

import ast
from pathlib import Path

import danube

ALLOWED = ("danube._wal", "danube.codec", "danube.storage", "danube.config_errors",
           "danube.config_keys", "danube.fslock")
ROOT = Path(danube.__file__).parent


def imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_storage_imports_only_codec_bottom_modules_and_itself():
    files = sorted((ROOT / "storage").rglob("*.py"))
    assert len(files) > 20
    wrong = {}
    for path in files:
        bad = [m for m in imports(path) if m.split(".")[0] == "danube" and m != "danube"
               and not any(m == a or m.startswith(a + ".") for a in ALLOWED)]
        if bad:
            wrong[str(path.relative_to(ROOT))] = bad
    assert not wrong


def test_the_bottom_modules_import_nothing_of_danube():
    for name in ("config_errors.py", "fslock.py", "config_keys.py"):
        assert not [m for m in imports(ROOT / name) if m.split(".")[0] == "danube"], name
