"""Kill -9 a writer at random moments; the store must reopen at a commit it made, and snapshots must either
load to the state they were saved at or be refused clearly. A longer soak: tools/crash_soak.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests._support.crash_trial import kill_trial


@pytest.mark.parametrize("trial", range(12))
def test_sigkill_at_random_moments(tmp_path, trial):
    rng = np.random.default_rng(trial)
    seen = kill_trial(str(tmp_path), seed=trial, delay=float(rng.uniform(0.0, 0.35)))
    assert seen["snapshot"] in ("none", "refused", "loaded")
