"""Shared helpers live in ``tests/_support/`` (no test file imports another), and the tests of the public API
read no private state: every file under ``tests/store/`` and ``tests/integrations/`` (and the scripts they
run in other interpreters) reaches into a store only through ``tests/_support/internals.py``, the one
documented place for the few hooks a test needs (fault injection, a part run on a store's own ring).
Tests of a part itself live in its layer's folder and construct the part."""

from __future__ import annotations

import ast
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
PUBLIC_API_FOLDERS = ("store", "integrations")
# private names that belong to Python itself, not to mmreplay objects
ALLOWED = {"_exit", "_getframe", "_fields", "_replace", "_asdict", "_make", "_field_defaults"}


def _code(tree: ast.AST, first: int = 1):  # noqa: ANN202
    """``(tree, its first line)`` and the same of every string constant in it that parses as a Python script
    (run in a subprocess)."""
    yield tree, first
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" in node.value:
            try:
                script = ast.parse(node.value)
            except SyntaxError:
                continue
            if any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(script)):
                yield from _code(script, first + node.lineno - 1)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reads(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every private attribute read or written on something other than ``self``/``cls``,
    and of every private name imported from mmreplay."""
    found = []
    for tree, first in _code(ast.parse(source)):
        for node in ast.walk(tree):
            line = first + node.lineno - 1 if hasattr(node, "lineno") else first
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if _private(getattr(node.value, "attr", "")):
                    continue  # a reach through one already found (``a._b._c``: ``a._b``)
                if node.attr in ALLOWED or (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    continue
                found.append((line, ast.unparse(node)))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmreplay"):
                names = [(node.module or "")] + [a.name for a in node.names]
                if any(_private(part) for name in names for part in name.split(".")):
                    found.append((line, f"from {node.module} import ..."))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("mmreplay") and any(_private(p) for p in a.name.split(".")):
                        found.append((line, f"import {a.name}"))
    return sorted(found)


def test_private_reads_are_found():
    src = ('import os\nfrom mmreplay._inputs import Inputs\nclass A:\n    def f(self):\n        return self._x\n'
           's = store._parts.log\nos._exit(0)\nCODE = """\nimport mmreplay as mr\nprint(s._reader)\n"""\n')
    assert private_reads(src) == [(2, "from mmreplay._inputs import ..."), (6, "store._parts"), (10, "s._reader")]


def test_public_api_tests_read_no_private_state():
    bad = []
    for folder in PUBLIC_API_FOLDERS:
        for root, _, names in os.walk(os.path.join(TESTS, folder)):
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    with open(path, encoding="utf-8") as f:
                        bad += [f"{os.path.relpath(path, TESTS)}:{line}: {what}" for line, what in private_reads(f.read())]
    assert not bad, "private state read outside tests/_support/internals.py:\n" + "\n".join(bad)


def test_test_files_import_helpers_from_support_only():
    bad = []
    for root, _, names in os.walk(TESTS):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                               else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    bad += [f"{os.path.relpath(path, TESTS)}:{node.lineno}: {m}" for m in modules
                            if m.split(".")[0] == "tests" and not m.startswith("tests._support")]
    assert not bad, "test modules imported as helpers (move what they share to tests/_support/):\n" + "\n".join(bad)
