"""The build backend of python/: scikit-build-core, which builds libmoecomm
through the repository's CMakeLists.txt, plus NVSHMEM where it is needed.

The nvshmem transport compiles against the nvidia-nvshmem-cu13 wheel. In pip's
isolated build environment only the build requirements can be imported, so
that wheel has to be one of them; it is asked for only where CMake will build
the GPU transports (an nvcc CMake finds, no NVSHMEM_HOME, neither MC_CUDA nor
MC_NVSHMEM set to OFF), so a CPU-only build downloads nothing more. Its
location is then given to CMake as MC_NVSHMEM_HOME, because CMake's own lookup
asks the `python3` on PATH, which need not be the interpreter of the build.
"""
import os
import shlex
import shutil

from scikit_build_core import build as _skb
from scikit_build_core.build import *  # noqa: F401,F403  (the hooks not changed here)

NVSHMEM = "nvidia-nvshmem-cu13==3.4.5"


def _defines(config_settings):
    """The CMake defines given to this build: -C cmake.define.X=V,
    SKBUILD_CMAKE_DEFINE="X=V;..." and -DX=V in CMAKE_ARGS (later wins)."""
    out = {}
    for word in shlex.split(os.environ.get("CMAKE_ARGS", "")):
        if word.startswith("-D") and "=" in word:
            name, value = word[2:].split("=", 1)
            out[name.split(":")[0]] = value
    for item in os.environ.get("SKBUILD_CMAKE_DEFINE", "").split(";"):
        if "=" in item:
            name, value = item.split("=", 1)
            out[name.strip()] = value
    for key, value in (config_settings or {}).items():
        if key.startswith("cmake.define."):
            out[key[len("cmake.define."):]] = value
    return out


def _nvcc_found():
    """Where CMake looks for nvcc: CUDACXX, PATH, $CUDA_PATH/bin."""
    if os.environ.get("CUDACXX") or shutil.which("nvcc"):
        return True
    cuda = os.environ.get("CUDA_PATH")
    return bool(cuda) and os.access(os.path.join(cuda, "bin", "nvcc"), os.X_OK)


def _wants_nvshmem(config_settings):
    d = _defines(config_settings)
    off = {"OFF", "0", "FALSE", "NO", "N"}
    if str(d.get("MC_CUDA", "")).upper() in off or str(d.get("MC_NVSHMEM", "")).upper() in off:
        return False
    if os.environ.get("NVSHMEM_HOME") or d.get("MC_NVSHMEM_HOME"):
        return False  # the user's NVSHMEM, found by CMake
    return _nvcc_found()


def _with_nvshmem_home(config_settings):
    if not _wants_nvshmem(config_settings):
        return config_settings
    try:
        import nvidia.nvshmem
    except ImportError:
        return config_settings  # a build without isolation and without the wheel: CMake decides
    home = list(nvidia.nvshmem.__path__)[0]
    return {**(config_settings or {}), "cmake.define.MC_NVSHMEM_HOME": home}


def get_requires_for_build_wheel(config_settings=None):
    extra = [NVSHMEM] if _wants_nvshmem(config_settings) else []
    return _skb.get_requires_for_build_wheel(config_settings) + extra


def get_requires_for_build_editable(config_settings=None):
    extra = [NVSHMEM] if _wants_nvshmem(config_settings) else []
    return _skb.get_requires_for_build_editable(config_settings) + extra


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _skb.build_wheel(wheel_directory, _with_nvshmem_home(config_settings), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _skb.build_editable(wheel_directory, _with_nvshmem_home(config_settings), metadata_directory)
