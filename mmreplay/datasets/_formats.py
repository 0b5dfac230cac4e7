"""The dataset formats: one registration each. A format is a module of this package with its functions
(an exporter ``(store_or_path, out, *, overwrite, progress, **options)``, an importer ``(src, path,
**options)``, a describer ``(path, storage_options)``; a format may lack the first two) and a test that
recognises its files; ``export``, ``import_dataset``, ``describe`` and ``detect_format`` look formats up
here. A module is imported when its format is first used, so an optional dependency (h5py, minari) is
needed only then.

Adding a format: its module, and one ``register(Format(...))`` line below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._location import Location


@dataclass(frozen=True)
class Format:
    name: str  # what ``format=`` names, as results and ``detect_format`` report it
    module: str  # the module of this package that implements it
    recognises: Callable[[Location], bool]  # True for a file or directory of this format
    looks_like: str  # what an unrecognised path was expected to be, for the error ("a zarr group")
    directory: bool  # whether the format is a directory (else a file)
    describer: str  # the names of the module's functions: describe, export (None: no export), import
    exporter: str | None
    importer: str | None
    aliases: tuple[str, ...] = ()  # other names ``format=`` accepts
    listed: tuple[str, ...] = ()  # the names the list of import formats shows (default: the name)

    def function(self, name: str) -> Any:
        """The module's function ``name`` (the module imported now)."""
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), name)


FORMATS: dict[str, Format] = {}  # by name, in registration order (the export list's order)


def register(fmt: Format) -> None:
    FORMATS[fmt.name] = fmt


def _zarr(loc: Location) -> bool:
    return loc.join("zarr.json").exists()


def _minari(loc: Location) -> bool:
    return loc.join("metadata.json").exists() or loc.join("data", "metadata.json").exists()


def _dqn_replay(loc: Location) -> bool:
    return bool(loc.glob("$store$_*_ckpt.*.gz"))


def _hdf5(loc: Location) -> bool:
    return loc.head(8) == b"\x89HDF\r\n\x1a\n"


# (zarr first: the default export format; detection tries the formats in this order)
register(Format("zarr", "zarr_format", _zarr, "a zarr group", True, "describe_zarr", "export_zarr", "import_zarr"))
register(Format("hdf5", "d4rl", _hdf5, "HDF5 in the D4RL layout", False, "describe_d4rl", "export_hdf5", "import_d4rl",
                aliases=("d4rl", "h5"), listed=("d4rl", "hdf5")))
register(Format("minari", "minari_format", _minari, "a Minari dataset", True, "describe_minari", "export_minari",
                "import_minari"))
register(Format("dqn-replay", "dqn_replay", _dqn_replay, "Dopamine replay checkpoints", True,
                "describe_dqn_replay", None, "import_dqn_replay", aliases=("dqn", "dopamine")))


def export_names() -> tuple[str, ...]:
    return tuple(f.name for f in FORMATS.values() if f.exporter)


def import_names() -> tuple[str, ...]:
    """The names the import list shows, alphabetical by format."""
    return tuple(n for f in sorted(FORMATS.values(), key=lambda f: f.name) if f.importer for n in f.listed or (f.name,))


def aliases() -> dict[str, str]:
    return {a: f.name for f in FORMATS.values() for a in f.aliases}


def expected(directory: bool) -> str:
    """``"a, b or c"``: what a directory (or a file) was expected to be."""
    what = [f.looks_like for f in FORMATS.values() if f.directory == directory]
    return what[0] if len(what) == 1 else ", ".join(what[:-1]) + " or " + what[-1]
