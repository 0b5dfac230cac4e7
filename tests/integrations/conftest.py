"""Fixtures of the integration tests: PyTorch and ``mmreplay.torch``, ``mmreplay.sb3`` and Gymnasium's spaces,
imported once per module (skipped, naming the extra, where it is not installed)."""

from __future__ import annotations

import pytest

from tests._support.helpers import require


@pytest.fixture(scope="module")
def torch():  # noqa: ANN201
    return require("torch")


@pytest.fixture(scope="module")
def mt(torch):  # noqa: ANN001, ANN201
    import mmreplay.torch as mt

    return mt


@pytest.fixture(scope="module")
def accelerator(torch) -> bool:  # noqa: ANN001
    """Whether PyTorch has an accelerator to pin memory for (what ``pin_memory=True`` needs)."""
    acc = getattr(torch, "accelerator", None)
    return bool(acc.is_available()) if acc is not None else bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def sb3():  # noqa: ANN201
    require("stable_baselines3")
    import mmreplay.sb3 as sb3

    return sb3


@pytest.fixture(scope="module")
def spaces():  # noqa: ANN201
    return require("gymnasium").spaces
