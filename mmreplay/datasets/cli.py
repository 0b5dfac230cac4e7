"""Dataset commands (``export``, ``import``): registered here."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """No dataset commands yet."""
