"""Samplers: which transitions a batch holds (uniform, prioritized), behind one protocol (``Sampler``).

Each sampler is a module with a class that keeps the protocol of ``base.Sampler``, and one registration
below: which schemas it serves and how it is built. ``make_sampler`` builds the first registered sampler
that serves the schema, and the uniform one where none does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.index import Index
from ..options import Schema
from .base import Priorities, Sampler
from .prioritized import PrioritizedSampler
from .uniform import UniformSampler

__all__ = ["Sampler", "Priorities", "UniformSampler", "PrioritizedSampler", "make_sampler", "SAMPLERS", "SamplerKind"]


@dataclass(frozen=True)
class SamplerKind:
    name: str
    serves: Callable[[Schema], bool]  # whether a store with this schema samples this way
    make: Callable[[Index, Schema], Sampler]


SAMPLERS: list[SamplerKind] = []  # asked in order; UNIFORM serves the schemas none of them serves
UNIFORM = SamplerKind("uniform", lambda schema: True, lambda index, schema: UniformSampler(index))


def register(kind: SamplerKind) -> None:
    SAMPLERS.append(kind)


register(SamplerKind("prioritized", lambda schema: schema.prioritized is not None,
                     lambda index, schema: PrioritizedSampler(index, schema.prioritized)))  # type: ignore[arg-type]


def make_sampler(schema: Schema, index: Index) -> Sampler:
    """The sampler a store's schema asks for."""
    return next((kind for kind in SAMPLERS if kind.serves(schema)), UNIFORM).make(index, schema)
