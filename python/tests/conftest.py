"""Shared fixtures: import path, a printed seed per test."""
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE.parent, HERE):  # the package from the checkout, and mc_ref/mc_run
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


@pytest.fixture
def rng(request):
    """A fresh generator; its seed is printed (shown on failure). MC_SEED replays."""
    seed = int(os.environ.get("MC_SEED", time.time_ns() % (2**32)))
    print(f"MC_SEED={seed} ({request.node.nodeid})")
    return np.random.default_rng(seed)
