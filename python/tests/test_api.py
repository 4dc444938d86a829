"""Versions, strings, struct layouts against C, create/destroy rules."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

import moecomm
from moecomm import capi

ROOT = Path(__file__).resolve().parents[2]


def test_version_and_strings():
    assert moecomm.version() == (capi.VERSION_MAJOR, capi.VERSION_MINOR, capi.VERSION_PATCH)
    assert moecomm.result_string(capi.ERR_TIMEOUT).startswith("MC_ERR_TIMEOUT")
    assert moecomm.result_string(capi.SUCCESS)
    assert [moecomm.dtype_size(d) for d in ("fp32", "bf16", "fp16")] == [4, 2, 2]
    assert capi.text(capi.lib.mc_transport_name(capi.TRANSPORT_CPU)) == "cpu"


def test_result_codes_agree_with_the_header():
    """Every mc_result_t of include/moecomm.h: the same number in the binding, the C string
    names it, and the exception class the binding raises for it."""
    import re
    header = (ROOT / "include" / "moecomm.h").read_text()
    codes = dict(re.findall(r"^\s*MC_(SUCCESS|ERR_[A-Z_]+) = (\d+)", header, re.M))
    assert len(codes) >= 11
    for name, value in codes.items():
        assert getattr(capi, name) == int(value), name
        assert moecomm.result_string(int(value)).startswith("MC_" + name), name
        exc = moecomm.errors.error_for(int(value), "x")
        want = (moecomm.MoecommTimeout if name == "ERR_TIMEOUT" else
                moecomm.MoecommCapacity if name == "ERR_CAPACITY" else
                moecomm.MoecommInvalid if name in ("ERR_INVALID_ARG", "ERR_INVALID_USAGE") else moecomm.MoecommError)
        assert type(exc) is want, name


C_LAYOUT = r"""
#include <stdio.h>
#include <stddef.h>
#include "moecomm.h"
#define F(T, f) printf(#T "." #f " %zu\n", offsetof(T, f));
int main(void) {
  printf("mc_comm_config_t %zu\nmc_a2a_config_t %zu\nmc_a2a_stats_t %zu\nmc_oob_t %zu\nmc_packed_recv_t %zu\n",
         sizeof(mc_comm_config_t), sizeof(mc_a2a_config_t), sizeof(mc_a2a_stats_t), sizeof(mc_oob_t),
         sizeof(mc_packed_recv_t));
  F(mc_a2a_config_t, token_bytes) F(mc_a2a_config_t, hidden) F(mc_a2a_config_t, combine_out_dtype)
  F(mc_a2a_config_t, index_dtype) F(mc_a2a_config_t, dispatch_input) F(mc_a2a_config_t, scale_format)
  F(mc_a2a_config_t, recv_layout) F(mc_a2a_config_t, expert_align)
  F(mc_comm_config_t, device) F(mc_a2a_stats_t, buffer_bytes) F(mc_oob_t, world_size)
  F(mc_packed_recv_t, capacity) F(mc_packed_recv_t, x) F(mc_packed_recv_t, row_expert)
  F(mc_packed_recv_t, row_weight) F(mc_packed_recv_t, expert_offset) F(mc_packed_recv_t, src_count)
  F(mc_packed_recv_t, rows)
  return 0;
}
"""


def test_struct_layout_matches_c(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    (tmp_path / "l.c").write_text(C_LAYOUT)
    subprocess.run([cc, "-I", str(ROOT / "include"), "-o", str(tmp_path / "l"), str(tmp_path / "l.c")], check=True)
    got = dict(line.split() for line in subprocess.run([str(tmp_path / "l")], capture_output=True,
                                                       text=True, check=True).stdout.splitlines())
    py = {"mc_comm_config_t": capi.CommConfig, "mc_a2a_config_t": capi.A2AConfig,
          "mc_a2a_stats_t": capi.A2AStats, "mc_oob_t": capi.Oob, "mc_packed_recv_t": capi.PackedRecvT}
    for name, cls in py.items():
        assert int(got[name]) == ctypes.sizeof(cls), name
        for key, off in got.items():
            if key.startswith(name + "."):
                assert int(off) == getattr(cls, key.split(".")[1]).offset, key


def _comm1():
    group = moecomm.ThreadsGroup(1, 2000)
    return moecomm.Communicator.from_threads(group, 0, timeout_ms=2000)


def test_a2a_config_size_is_checked_by_c():
    comm = _comm1()
    cfg = capi.a2a_config()
    cfg.max_tokens, cfg.num_experts, cfg.experts_per_token, cfg.token_bytes, cfg.hidden = 4, 4, 2, 32, 16
    a2a = moecomm.AllToAll.__new__(moecomm.AllToAll)
    a2a.comm = comm
    a2a._create(cfg)  # the initializer's size: accepted
    a2a.destroy()
    cfg.size = ctypes.sizeof(capi.A2AConfig) - 8
    with pytest.raises(moecomm.MoecommInvalid, match="MC_A2A_CONFIG_INITIALIZER"):
        a2a._create(cfg)
    comm.destroy()


def test_comm_config_size_is_checked_by_c():
    group = moecomm.ThreadsGroup(1, 2000)
    cfg = capi.comm_config()
    cfg.size -= 4
    h = ctypes.c_void_p()
    rc = capi.lib.mc_comm_create(ctypes.byref(group.oob(0)), ctypes.byref(cfg), ctypes.byref(h))
    assert rc == capi.ERR_INVALID_ARG and "MC_COMM_CONFIG_INITIALIZER" in moecomm.last_error()


def test_comm_accessors_and_destroy_order():
    comm = _comm1()
    assert (comm.rank, comm.world_size, comm.group_size, comm.transport) == (0, 1, 1, "cpu")
    a2a = moecomm.AllToAll(comm, max_tokens=4, num_experts=4, experts_per_token=2, hidden=16)
    assert (a2a.num_local_experts, a2a.expert_capacity) == (4, 4)
    assert a2a.get_stats()["buffer_bytes"] > 0
    a2a.check()
    with pytest.raises(moecomm.MoecommInvalid) as ei:
        comm.destroy()  # a live a2a
    assert ei.value.code == capi.ERR_INVALID_USAGE and ei.value.message
    a2a.destroy()
    comm.destroy()


def test_bad_a2a_config_names_the_field():
    comm = _comm1()
    with pytest.raises(moecomm.MoecommInvalid, match="num_experts"):
        moecomm.AllToAll(comm, max_tokens=4, num_experts=0, experts_per_token=2, hidden=16)
    with pytest.raises(moecomm.MoecommInvalid, match="combine_in_dtype"):
        moecomm.AllToAll(comm, max_tokens=4, num_experts=4, experts_per_token=2, hidden=16, combine_in_dtype="int8")
    comm.destroy()


def test_failing_python_allgather_is_reported_not_propagated():
    def allgather(data):
        raise RuntimeError("boom")

    with pytest.raises(moecomm.MoecommError, match="boom") as ei:
        moecomm.Communicator(allgather, 0, 1)
    assert ei.value.code == capi.ERR_BOOTSTRAP


def test_missing_library_error_names_places(monkeypatch):
    from moecomm import _lib
    monkeypatch.setenv("MOECOMM_LIB", "/nonexistent/libmoecomm.so")
    monkeypatch.setattr(_lib, "_LIB", None)
    with pytest.raises(OSError, match="MOECOMM_LIB"):
        _lib.load()


@pytest.mark.parametrize("fmt", ["fp32", "ue8m0"])
def test_dispatch_quantises_bf16_rows(fmt):
    """dispatch_input="bf16_to_e4m3": dp_x holds bf16 rows, expert_x gets e4m3 bytes and
    expert_x_scale one scale per 128 values; dequantised, each value is within half an
    e4m3 step of its input (the bit-exact rules are tested in C against the reference)."""
    import numpy as np
    comm = _comm1()
    H, m = 512, 3
    with pytest.raises(moecomm.MoecommInvalid, match="multiple of"):
        moecomm.AllToAll(comm, max_tokens=4, num_experts=4, experts_per_token=2, hidden=H + 128,
                         dispatch_input="bf16_to_e4m3", scale_format="ue8m0")
    a2a = moecomm.AllToAll(comm, max_tokens=4, num_experts=4, experts_per_token=2, hidden=H,
                           dispatch_input="bf16_to_e4m3", scale_format=fmt)
    assert a2a.config.token_bytes == H and a2a.config.scale_bytes == H // 128 * (1 if fmt == "ue8m0" else 4)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((m, H)) * np.exp2(rng.integers(-20, 20, (m, 1)))).astype(np.float32)
    xb = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: the values dispatch sees
    idx = np.array([[0, 1], [2, 3], [1, 2]], np.int32)
    cnt, ex, exs = a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(), a2a.alloc_expert_x_scale()
    assert exs.dtype == (np.uint8 if fmt == "ue8m0" else np.float32)
    with pytest.raises(moecomm.MoecommInvalid, match="dp_x_scale"):
        a2a.dispatch(cnt, ex, exs, xb, np.ones((m, H // 128), np.float32), idx)
    a2a.dispatch(cnt, ex, exs, xb, None, idx)
    # e4m3 decoded with numpy: sign, 4 exponent bits (bias 7), 3 mantissa bits
    q = ex[0, : cnt[0]].astype(np.int32)
    e, f = (q >> 3) & 15, q & 7
    val = np.where(e > 0, (1 + f / 8) * np.exp2(e - 7.0), f * 2.0 ** -9) * np.where(q & 0x80, -1, 1)
    sc = exs[0, : cnt[0]]
    s = np.exp2(sc.astype(np.float64) - 127) if fmt == "ue8m0" else sc.astype(np.float64)
    got = val * np.repeat(s, 128, axis=1)
    assert list(cnt) == [1, 2, 2, 1]
    want = (xb.astype(np.uint32) << 16).view(np.float32)[[0]].astype(np.float64)  # expert 0's token: token 0
    tol = np.maximum(np.abs(want) / 16, np.repeat(s, 128, axis=1) * 2.0 ** -10)
    assert np.all(np.abs(got - want) <= tol * 1.0001)
    a2a.combine(a2a.alloc_out_tokens(), a2a.alloc_expert_y())
    a2a.destroy()
    comm.destroy()
