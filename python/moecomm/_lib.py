"""Finding and loading libmoecomm.so (once per process)."""
import ctypes
import ctypes.util
import os
from pathlib import Path

_LIB = None


def _candidates():
    """The places tried, in order, as (description, path or None)."""
    env = os.environ.get("MOECOMM_LIB")
    checkout = Path(__file__).resolve().parents[2] / "build" / "libmoecomm.so"
    found = ctypes.util.find_library("moecomm")
    return [
        ("env MOECOMM_LIB", env),
        ("the checkout's build/libmoecomm.so", str(checkout) if checkout.exists() else None),
        ('ctypes.util.find_library("moecomm")', found),
    ]


def load():
    """The loaded CDLL; raises OSError naming every place tried."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for what, path in _candidates():
        if not path:
            tried.append(f"{what}: not set / not found")
            continue
        try:
            _LIB = ctypes.CDLL(path)
            return _LIB
        except OSError as e:
            tried.append(f"{what}: {path}: {e}")
            if what.startswith("env"):
                break  # an explicit choice that fails is an error, not a hint
    raise OSError("moecomm: cannot load libmoecomm.so; tried:\n  " + "\n  ".join(tried) +
                  "\nBuild it with `make build` in the repository, or set MOECOMM_LIB to its path.")
