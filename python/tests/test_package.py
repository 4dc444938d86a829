"""The package under test and its library: where they come from, and the
order in which the loader looks.

tests/test_python.sh installs the wheel into a venv and sets
MOECOMM_TEST_PREFIX to that venv: there the package must be the venv's and
the library the one inside it, so that a wheel without its library, or a run
that picked up python/ of the checkout, fails here."""
import os
import shutil
from pathlib import Path

import pytest

import moecomm
from moecomm import _lib, capi

PREFIX = os.environ.get("MOECOMM_TEST_PREFIX")
PKG = Path(moecomm.__file__).resolve().parent


@pytest.mark.skipif(not PREFIX, reason="MOECOMM_TEST_PREFIX unset: not testing an installed package")
def test_package_is_the_installed_one():
    assert Path(PREFIX).resolve() in PKG.parents, f"moecomm imported from {PKG}, not from {PREFIX}"
    assert "site-packages" in PKG.parts, PKG


@pytest.mark.skipif(not PREFIX, reason="MOECOMM_TEST_PREFIX unset: not testing an installed package")
def test_library_is_the_packaged_one():
    assert "MOECOMM_LIB" not in os.environ
    assert Path(capi.lib._name).resolve() == PKG / "lib" / "libmoecomm.so"


def _fake_checkout(tmp_path, packaged, built):
    """tmp/python/moecomm (+ pyproject.toml) and tmp/build, each with the
    real library or a file that is no library."""
    lib = Path(capi.lib._name)
    pkg = tmp_path / "python" / "moecomm"
    (pkg / "lib").mkdir(parents=True)
    (tmp_path / "python" / "pyproject.toml").write_text("")
    (tmp_path / "build").mkdir()
    for path, real in ((pkg / "lib" / "libmoecomm.so", packaged), (tmp_path / "build" / "libmoecomm.so", built)):
        if real:
            shutil.copyfile(lib, path)
        elif real is not None:
            path.write_text("not a library\n" * 100)  # long enough for the loader to read a header
    return pkg


@pytest.fixture
def fresh_loader(monkeypatch):
    monkeypatch.delenv("MOECOMM_LIB", raising=False)
    monkeypatch.setattr(_lib, "_LIB", None)
    return monkeypatch


def test_packaged_library_comes_before_the_checkout(fresh_loader, tmp_path):
    pkg = _fake_checkout(tmp_path, packaged=True, built=False)
    fresh_loader.setattr(_lib, "_HERE", pkg)
    assert Path(_lib.load()._name) == pkg / "lib" / "libmoecomm.so"


def test_checkout_build_is_the_last_fallback(fresh_loader, tmp_path):
    pkg = _fake_checkout(tmp_path, packaged=None, built=True)
    fresh_loader.setattr(_lib, "_HERE", pkg)
    assert Path(_lib.load()._name) == tmp_path / "build" / "libmoecomm.so"


def test_error_names_every_place_tried(fresh_loader, tmp_path):
    pkg = _fake_checkout(tmp_path, packaged=False, built=None)
    fresh_loader.setattr(_lib, "_HERE", pkg)
    with pytest.raises(OSError) as ei:
        _lib.load()
    text = str(ei.value)
    assert str(pkg / "lib" / "libmoecomm.so") in text and "invalid ELF header" in text
    assert str(tmp_path / "build" / "libmoecomm.so") in text and "no such file" in text
    assert "MOECOMM_LIB" in text


def test_moecomm_lib_overrides_and_its_failure_is_final(fresh_loader, tmp_path):
    pkg = _fake_checkout(tmp_path, packaged=True, built=True)
    fresh_loader.setattr(_lib, "_HERE", pkg)
    other = tmp_path / "other.so"
    shutil.copyfile(capi.lib._name, other)
    fresh_loader.setenv("MOECOMM_LIB", str(other))
    assert Path(_lib.load()._name) == other
    fresh_loader.setattr(_lib, "_LIB", None)
    fresh_loader.setenv("MOECOMM_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(OSError) as ei:
        _lib.load()
    tried = [line for line in str(ei.value).splitlines() if line.startswith("  ")]
    assert len(tried) == 1 and tried[0].startswith("  $MOECOMM_LIB: "), tried
