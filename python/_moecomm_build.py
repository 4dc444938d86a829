"""The build backend of python/: scikit-build-core, which builds libmoecomm
through the repository's CMakeLists.txt, plus NVSHMEM where it is needed.

The nvshmem transport compiles against the nvidia-nvshmem-cu13 wheel. In pip's
isolated build environment only the build requirements can be imported, so
that wheel has to be one of them; it is asked for only where CMake will build
the GPU transports (an nvcc CMake finds, no NVSHMEM_HOME, neither MC_CUDA nor
MC_NVSHMEM set to OFF), so a CPU-only build downloads nothing more. Its
location is then given to CMake as MC_NVSHMEM_HOME, because CMake's own lookup
asks the `python3` on PATH, which need not be the interpreter of the build.

A library built so cannot load without libnvshmem_host.so.3, whatever the
transport, so such a wheel also requires that wheel at run time: one
Requires-Dist line added to the metadata (the prepared one and the wheel's),
which keeps `pip install ./python` working where nvcc is found, with or
without the gpu extra.
"""
import base64
import hashlib
import os
import shlex
import shutil
import zipfile
from pathlib import Path

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
    """Whether this build uses the nvidia-nvshmem-cu13 wheel (at build and run time)."""
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


def _add_requirement(metadata):
    """METADATA (headers, a blank line, the README) with Requires-Dist: NVSHMEM."""
    head, sep, body = metadata.partition(b"\n\n")
    return head.rstrip(b"\n") + f"\nRequires-Dist: {NVSHMEM}\n".encode() + (b"\n" + body if sep else b"")


def _require_in_wheel(wheel):
    """Rewrite the wheel with the requirement in METADATA and RECORD to match."""
    with zipfile.ZipFile(wheel) as z:
        entries = [(info, z.read(info)) for info in z.infolist()]
    meta_name = next(info.filename for info, _ in entries if info.filename.endswith(".dist-info/METADATA"))
    meta = _add_requirement(next(data for info, data in entries if info.filename == meta_name))
    digest = base64.urlsafe_b64encode(hashlib.sha256(meta).digest()).rstrip(b"=").decode()
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as out:
        for info, data in entries:
            if info.filename == meta_name:
                data = meta
            elif info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                lines = [f"{meta_name},sha256={digest},{len(meta)}" if line.startswith(meta_name + ",") else line
                         for line in lines]
                data = ("\n".join(lines) + "\n").encode()
            out.writestr(info, data)
    os.replace(tmp, wheel)


def get_requires_for_build_wheel(config_settings=None):
    extra = [NVSHMEM] if _wants_nvshmem(config_settings) else []
    return _skb.get_requires_for_build_wheel(config_settings) + extra


def get_requires_for_build_editable(config_settings=None):
    extra = [NVSHMEM] if _wants_nvshmem(config_settings) else []
    return _skb.get_requires_for_build_editable(config_settings) + extra


def _build(hook, wheel_directory, config_settings):
    # metadata_directory is not passed on: scikit-build-core would compare it,
    # with the requirement added below, to the metadata it makes itself
    name = hook(wheel_directory, _with_nvshmem_home(config_settings), None)
    if _wants_nvshmem(config_settings):
        _require_in_wheel(Path(wheel_directory) / name)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(_skb.build_wheel, wheel_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(_skb.build_editable, wheel_directory, config_settings)


def _prepare(hook, metadata_directory, config_settings):
    name = hook(metadata_directory, config_settings)
    if _wants_nvshmem(config_settings):
        path = Path(metadata_directory) / name / "METADATA"
        path.write_bytes(_add_requirement(path.read_bytes()))
    return name


if hasattr(_skb, "prepare_metadata_for_build_wheel"):  # scikit-build-core defines them where it can
    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        return _prepare(_skb.prepare_metadata_for_build_wheel, metadata_directory, config_settings)

    def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
        return _prepare(_skb.prepare_metadata_for_build_editable, metadata_directory, config_settings)
