"""Finding and loading libmoecomm.so (once per process).

Order: $MOECOMM_LIB when set (an explicit choice: if it fails to load, that
is the error, nothing else is tried); the library the wheel installed inside
this package (moecomm/lib/libmoecomm.so); the checkout's build/libmoecomm.so
when this package is python/moecomm of a checkout (running without install).
No system-wide lookup: the ctypes declarations mirror this version's header,
and a libmoecomm of another version found on the loader path would be a
silent ABI mismatch.
"""
import ctypes
import os
from pathlib import Path

_LIB = None
_ENV = "$MOECOMM_LIB"
_HERE = Path(__file__).resolve().parent


def _candidates():
    """The places tried, in order, as (description, path)."""
    env = os.environ.get("MOECOMM_LIB")
    if env:
        return [(_ENV, env)]
    packaged = _HERE / "lib" / "libmoecomm.so"
    out = [("the package's lib/libmoecomm.so", str(packaged))]
    # python/moecomm next to python/pyproject.toml: a checkout, not an install
    if (_HERE.parent / "pyproject.toml").is_file():
        out.append(("the checkout's build/libmoecomm.so", str(_HERE.parents[1] / "build" / "libmoecomm.so")))
    return out


def _hint(error):
    if "nvshmem" in str(error):
        return ("\nThis library was built with the nvshmem transport: install the package's gpu extra"
                " (`pip install './python[gpu]'`, or `pip install nvidia-nvshmem-cu13==3.4.5`) beside it.")
    return ""


def load():
    """The loaded CDLL; raises OSError naming every place tried."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried, hint = [], ""
    for what, path in _candidates():
        if what != _ENV and not os.path.exists(path):  # the override may be a bare name
            tried.append(f"{what}: {path}: no such file")
            continue
        try:
            _LIB = ctypes.CDLL(path)
            return _LIB
        except OSError as e:
            tried.append(f"{what}: {path}: {e}")
            hint = hint or _hint(e)
    raise OSError("moecomm: cannot load libmoecomm.so; tried:\n  " + "\n  ".join(tried) + hint +
                  "\nInstall the package with its library (`pip install ./python` in the repository),"
                  " or set MOECOMM_LIB to a libmoecomm.so.")
