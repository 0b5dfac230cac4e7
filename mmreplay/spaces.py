"""Gymnasium spaces as JSON, in the form Minari writes them (duck-typed: gymnasium is not imported).

Used by the Gymnasium integration (a store records its env's action space in ``metadata``) and by the
Minari exporter.
"""

from __future__ import annotations

from typing import Any


def space_json(space: Any) -> dict[str, Any]:
    """Minari's JSON form of a Gymnasium Discrete/Box/MultiDiscrete space (without importing either)."""
    kind = type(space).__name__
    if kind == "Discrete":
        return {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}
    if kind == "Box":
        return {"type": "Box", "dtype": str(space.dtype), "shape": list(space.shape), "low": space.low.tolist(),
                "high": space.high.tolist()}
    if kind == "MultiDiscrete":
        return {"type": "MultiDiscrete", "dtype": str(space.dtype), "nvec": space.nvec.tolist(),
                "start": space.start.tolist()}
    raise TypeError(f"action_space: expected a Discrete, Box or MultiDiscrete space (or Minari's JSON of one),"
                    f" got {kind}")
