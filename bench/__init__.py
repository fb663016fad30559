"""Benchmarks, run from the repository root as ``python -m bench.X``. The root is then on
sys.path ahead of site-packages, and its danube/ is the source tree, without the compiled
modules that ``pip install .`` built into the installed package. So when an installed danube
exists, the root moves to the end of sys.path: the benchmarks measure what the README
installed, with no build step of their own. (``bench`` itself is imported by then, so its
modules are still found.) Child processes get the same through ``_proc.repo_env``."""

import importlib.machinery
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _prefer_installed_danube():
    if "danube" in sys.modules:
        return
    at_root = [p for p in sys.path if os.path.realpath(p or os.curdir) == _ROOT]
    if not at_root:
        return
    rest = [p for p in sys.path if p not in at_root]
    if importlib.machinery.PathFinder.find_spec("danube", rest) is None:
        return      # only the source tree has it (e.g. built in place): leave it first
    sys.path[:] = rest + at_root


_prefer_installed_danube()
