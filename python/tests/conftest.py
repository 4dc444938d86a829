"""Shared fixtures: the helpers' import path, a printed seed per test.

The package itself is imported as installed (tests/test_python.sh builds a
wheel and installs it into a venv); to test the checkout instead, put python/
on PYTHONPATH yourself."""
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # mc_ref, mc_run
    sys.path.insert(0, str(HERE))


@pytest.fixture
def rng(request):
    """A fresh generator; its seed is printed (shown on failure). MC_SEED replays."""
    seed = int(os.environ.get("MC_SEED", time.time_ns() % (2**32)))
    print(f"MC_SEED={seed} ({request.node.nodeid})")
    return np.random.default_rng(seed)
