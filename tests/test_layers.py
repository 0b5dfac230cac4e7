"""The package's imports point one way: storage <- index <- log/reader/batch <- sampling <- store <- datasets
<- integrations and command line. A module may import its own layer or lower ones only. The layers are
ARCHITECTURE.md's table ("The parts"), read from it: the document and this test cannot disagree."""

from __future__ import annotations

import ast
import fnmatch
import os
import re

import mmreplay

ROOT = os.path.dirname(os.path.abspath(mmreplay.__file__))
ARCHITECTURE = os.path.join(os.path.dirname(ROOT), "ARCHITECTURE.md")


def _names(cell: str) -> set[str]:
    """Package-relative names of the modules and packages a ``files`` cell of the table lists: `x.py`,
    `d/`, `d/x.py`, `cli*.py`. Names of files inside a package listed beside it (`base.py` of
    `sampling/`) are not top-level modules and are left out."""
    top = {n[:-3] if n.endswith(".py") else n for n in os.listdir(ROOT)
           if (n.endswith(".py") and n != "__init__.py") or os.path.isdir(os.path.join(ROOT, n, ""))
           and os.path.exists(os.path.join(ROOT, n, "__init__.py"))}
    found = set()
    for token in re.findall(r"`([^`]+)`", cell):
        if token.endswith("/"):
            name = token[:-1].replace("/", ".")
        elif token.endswith(".py"):
            name = token[:-3].replace("/", ".")
        else:
            continue
        if "*" in name:
            found |= set(fnmatch.filter(top, name))
        elif name in top or ("." in name and os.path.exists(os.path.join(ROOT, *name.split(".")) + ".py")):
            found.add(name)
    return found


def layers_from_architecture() -> list[set[str]]:
    """The layer table of ARCHITECTURE.md ("The parts"): ``layers[i]`` the names the rows of layer i list."""
    text = open(ARCHITECTURE, encoding="utf-8").read().split("## The parts", 1)[1].split("\n## ", 1)[0]
    layers: dict[int, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            layers.setdefault(int(cells[0]), set()).update(_names(cells[2]))
    assert sorted(layers) == list(range(len(layers))), f"ARCHITECTURE.md's layers are not 0..n: {sorted(layers)}"
    return [layers[i] for i in range(len(layers))]


LAYERS = layers_from_architecture()


# The one deliberate exception: ReplayStore.from_env (a convenience the API promises) imports the
# Gymnasium integration lazily, inside the method, so that importing the store never needs gymnasium.
ALLOWED_UPWARD = {("store", "gym")}


TOP = "(the mmreplay package itself)"  # importing it runs __init__, which imports every layer


def layer_of(module: str) -> int:
    """Layer of a module given relative to the package (``storage.ring``, ``datasets.cli``, ``store``)."""
    if module == TOP:
        return len(LAYERS)
    for name in (module, module.split(".")[0]):
        for i, names in enumerate(LAYERS):
            if name in names:
                return i
    raise AssertionError(f"mmreplay.{module} is in no layer: add it to LAYERS")


def _is_module(root: str, dotted: str) -> bool:
    path = os.path.join(root, *dotted.split("."))
    return os.path.isdir(path) or os.path.exists(path + ".py")


def imports(path: str, package: str, root: str) -> list[str]:
    """Package-relative names of the mmreplay modules a file imports, in every form: relative, absolute,
    ``import mmreplay``, ``from mmreplay import x`` and ``from . import name`` of a package's own names
    (which run that package's ``__init__``; for the top package, ``TOP``)."""
    tree = ast.parse(open(path).read())
    found = []

    def from_package(pkg: str, names: list[str]) -> None:
        for name in names:
            sub = ".".join(filter(None, [pkg, name]))
            if _is_module(root, sub):
                found.append(sub)
            else:
                found.append(pkg or TOP)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "mmreplay":
                    found.append(TOP)
                elif alias.name.startswith("mmreplay."):
                    found.append(alias.name[len("mmreplay."):])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base[1:] + ([node.module] if node.module else []))
            elif node.module == "mmreplay" or (node.module or "").startswith("mmreplay."):
                target = node.module[len("mmreplay."):] if node.module != "mmreplay" else ""
            else:
                continue
            if target and _is_module(root, target) and not os.path.isdir(os.path.join(root, *target.split("."))):
                found.append(target)  # from .module import name
            else:
                from_package(target, [a.name for a in node.names])  # from .package import name-or-module
    return found


def test_the_table_lists_the_layers():
    assert len(LAYERS) >= 9 and all(LAYERS)
    assert {"options", "_inputs", "native", "codecs"} <= LAYERS[0] and "storage" in LAYERS[1]
    assert {"store", "verify"} <= LAYERS[6] and {"cli.main", "cli.store", "datasets.cli", "__main__"} <= LAYERS[-1]
    listed = [name for names in LAYERS for name in names]
    assert len(listed) == len(set(listed)), "a module listed in two layers"


def test_imports_point_down_the_layers():
    root = ROOT
    checked = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py") or name == "__init__.py":
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            package = "mmreplay." + rel.rsplit(".", 1)[0] if "." in rel else "mmreplay"
            mine = layer_of(rel)
            for target in imports(path, package, root):
                if (rel, target) in ALLOWED_UPWARD:
                    continue
                assert layer_of(target) <= mine, f"mmreplay.{rel} (layer {mine}) imports mmreplay.{target}" \
                    f" (layer {layer_of(target)})"
                checked += 1
    assert checked > 50
