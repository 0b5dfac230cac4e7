"""The package's imports point one way: storage <- index <- log/reader/batch <- sampling <- store <- datasets
<- integrations and command line (ARCHITECTURE.md). A module may import its own layer or lower ones only."""

from __future__ import annotations

import ast
import os

import mmreplay

LAYERS = [
    {"errors", "options", "synthetic", "native", "numeric"},
    {"storage"},
    {"layout", "plan", "episodes", "index"},
    {"log", "reader", "batch", "prefetch", "statefiles", "snapshot", "_inputs", "ratelimit", "tables"},
    {"sampling", "writer"},
    {"drawing", "durability"},
    {"store", "verify"},
    {"datasets"},
    {"gym", "torch", "viz", "bench", "demo", "cli", "cli_store", "datasets.cli", "__main__"},
]


# The one deliberate exception: ReplayStore.from_env (a convenience the API promises) imports the
# Gymnasium integration lazily, inside the method, so that importing the store never needs gymnasium.
ALLOWED_UPWARD = {("store", "gym")}


def layer_of(module: str) -> int:
    """Layer of a module given relative to the package (``storage.ring``, ``datasets.cli``, ``store``)."""
    for name in (module, module.split(".")[0]):
        for i, names in enumerate(LAYERS):
            if name in names:
                return i
    raise AssertionError(f"mmreplay.{module} is in no layer: add it to LAYERS")


def imports(path: str, package: str) -> list[str]:
    """Package-relative names of the mmreplay modules a file imports (relative or absolute imports)."""
    tree = ast.parse(open(path).read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base[1:] + ([node.module] if node.module else []))
                if not node.module:  # "from . import x"
                    found += [".".join(filter(None, [target, a.name])) for a in node.names]
                    continue
                found.append(target)
            elif node.module and node.module.startswith("mmreplay."):
                found.append(node.module[len("mmreplay."):])
    return [f for f in found if f and f != "__version__" and not f.endswith("__version__")]


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
            for target in imports(path, package):
                if target.split(".")[-1] == "__init__" or (rel, target) in ALLOWED_UPWARD:
                    continue
                assert layer_of(target) <= mine, f"mmreplay.{rel} (layer {mine}) imports mmreplay.{target}" \
                    f" (layer {layer_of(target)})"
                checked += 1
    assert checked > 50
