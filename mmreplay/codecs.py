"""The codecs of sealed chunks' frame files: one registration each.

A codec is named by ``create(compression=...)`` and by the manifest's ``frames.codec``; its frame files
are ``chunks/<name>.obs.<suffix>``; ``reference`` builds the numcodecs codec that encodes and decodes one
frame entry on the reference path (``storage/framefile.py``: tests, and readers without numba). The
native encoder and decoder kernels are per codec (``native/lz4_encode.py``, ``native/lz4.py``).

Adding a codec: its kernels, and one ``register(Codec(...))`` line below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Codec:
    name: str
    suffix: str
    reference: Callable[[], Any]


REGISTRY: dict[str, Codec] = {}
AUTO = "lz4"  # what compression="auto" picks for image observations


def register(codec: Codec) -> None:
    REGISTRY[codec.name] = codec


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def _numcodecs_lz4() -> Any:
    from numcodecs import LZ4

    return LZ4()


register(Codec("lz4", "lz4", _numcodecs_lz4))
