"""Samplers: which transitions a batch holds (uniform, prioritized), behind one protocol (``Sampler``)."""

from __future__ import annotations

from ..index import Index
from ..options import Schema
from .base import Sampler
from .prioritized import PrioritizedSampler
from .uniform import UniformSampler

__all__ = ["Sampler", "UniformSampler", "PrioritizedSampler", "make_sampler"]


def make_sampler(schema: Schema, index: Index) -> Sampler:
    """The sampler a store's schema asks for."""
    if schema.prioritized is not None:
        return PrioritizedSampler(index, schema.prioritized)
    return UniformSampler(index)
