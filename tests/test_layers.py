"""The package's imports point one way: storage <- index <- log/reader/batch <- sampling <- store <- datasets
<- integrations and command line (ARCHITECTURE.md). A module may import its own layer or lower ones only."""

from __future__ import annotations

import ast
import os

import mmreplay

LAYERS = [
    {"errors", "options", "synthetic", "native", "version", "spaces"},
    {"storage"},
    {"layout", "plan", "sequences", "episodes", "index", "prefixcrc"},
    {"log", "reader", "batch", "sequence_batch", "prefetch", "statefiles", "snapshot", "_inputs", "ratelimit", "tables"},
    {"sampling", "writer"},
    {"drawing", "durability"},
    {"store", "verify"},
    {"datasets"},
    {"gym", "torch", "sb3", "ray", "viz", "bench", "demo", "cli", "cli_store", "datasets.cli", "__main__"},
]


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


def test_imports_point_down_the_layers():
    root = os.path.dirname(mmreplay.__file__)
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
