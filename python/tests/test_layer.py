"""moecomm.MoELayer on torch CPU tensors (cpu transport, ranks as threads)
against a dense reference of the same layer: router top-k (int64, as
torch.topk returns it) in, combined output out. Skipped without torch; the
GPU runs of the same helper are in test_torch_gpu.py."""
import os

import pytest

torch = pytest.importorskip("torch")

import moecomm  # noqa: E402
from mc_run import run_threads  # noqa: E402

H, E, K, T = 32, 8, 3, 10  # hidden, experts, top-k, max tokens per group


def _seed():
    return int(os.environ.get("MC_SEED", torch.randint(0, 2**31, ()).item()))


def _weights(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(H, E, generator=g), torch.randn(E, H, H, generator=g) / H ** 0.5


def _route(x, wr):
    p = torch.softmax(x.float() @ wr, dim=-1)
    w, ids = torch.topk(p, K, dim=-1)
    return (w / w.sum(-1, keepdim=True)).contiguous(), ids.contiguous()


def _dense(x, w, ids, we, dtype):
    """Every token through its experts: sum_k w_k * (x @ We[id_k]), each
    expert output rounded to the layer's dtype as the experts return it, the
    sum in fp32. Also the scale errors are measured against: sum_k w_k *
    (|x| @ |We[id_k]|), which bounds each term and its matmul's rounding."""
    out = torch.zeros(x.shape[0], H)
    mag = torch.zeros(x.shape[0], H)
    for k in range(K):
        wk = we[ids[:, k]]
        yk = torch.bmm(x.float().unsqueeze(1), wk).squeeze(1).to(dtype).float()
        out += w[:, k:k + 1] * yk
        mag += w[:, k:k + 1] * torch.bmm(x.float().abs().unsqueeze(1), wk.abs()).squeeze(1)
    return out, mag


@pytest.mark.parametrize("ws,gs,dtype,bound", [(1, 1, torch.float32, False), (2, 1, torch.float32, True),
                                              (4, 2, torch.bfloat16, False), (4, 1, torch.bfloat16, True)])
def test_layer_matches_dense(ws, gs, dtype, bound):
    seed = _seed()
    print(f"MC_SEED={seed}")
    wr, we = _weights(seed)
    L = E // ws
    # fp32: matmul order only; bf16: a row rounded on the wire and at the end
    # (2 u each, u = 2^-8), and an expert output 1 ulp apart where the two
    # matmuls round differently
    tol = 1e-5 if dtype == torch.float32 else 5 * 2.0 ** -8

    def rank_fn(rank, comm):
        g = torch.Generator().manual_seed(seed * 31 + rank // gs)  # the ranks of a group hold the same tokens
        local = we[rank * L:(rank + 1) * L].to(dtype)

        def experts(ex, count, _scale):
            assert ex.shape == (L, layer.expert_capacity, H) and count.dtype == torch.int32
            return torch.bmm(ex.float(), local.float()).to(layer.y_dtype)

        errs = []
        with moecomm.MoELayer(comm, max_tokens=T, num_experts=E, experts_per_token=K, hidden=H, dtype=dtype) as layer:
            for step in range(3):
                m = int(torch.randint(1, T + 1, (), generator=g))
                x = torch.randn(m, H, generator=g).to(dtype)
                w, ids = _route(x, wr)
                assert ids.dtype == torch.int64
                bm = int(torch.randint(0, m + 1, (), generator=g)) if bound else m
                bound_m = torch.tensor([bm], dtype=torch.int32) if bound else None
                layer.out.fill_(float("nan"))  # poison: a row left unwritten fails
                out = layer(x, ids, w, experts, bound_m=bound_m)
                assert out.shape == (m, H)
                ref, mag = _dense(x[:bm], w[:bm], ids[:bm], we.to(dtype).float(), dtype)
                errs.append(((out[:bm].float() - ref).abs() / (mag + 1e-6)).max().item() if bm else 0.0)
                if bm < m:
                    assert torch.isnan(out[bm:].float()).all(), "rows past bound_m were written"
        return errs

    for rank, errs in enumerate(run_threads(ws, rank_fn, group_size=gs)):
        assert max(errs) <= tol, f"rank {rank}: max relative error {max(errs)} over {tol} (MC_SEED={seed})"


@pytest.mark.parametrize("ws,align", [(1, 1), (2, 4), (4, 1)])
def test_layer_prefill_matches_dense(ws, align):
    """Calls past max_tokens take the expert-sorted layout (grouped_experts
    on contiguous rows), calls up to it the batched one, on one layer."""
    seed = _seed()
    print(f"MC_SEED={seed}")
    wr, we = _weights(seed)
    L, P = E // ws, 3 * T

    def rank_fn(rank, comm):
        g = torch.Generator().manual_seed(seed * 37 + rank)
        local = we[rank * L:(rank + 1) * L]

        def experts(ex, count, _scale):
            return torch.bmm(ex.float(), local).to(layer.y_dtype)

        def grouped(rows):
            assert rows.x.shape == (rows.rows, H) and rows.expert_offset.shape == (L + 1,)
            y = torch.full((rows.rows, H), float("nan"), dtype=layer.y_dtype)  # padding rows: never read
            for l in range(L):
                a, n = int(rows.expert_offset[l]), int(rows.expert_count[l])
                assert a % align == 0 and (rows.row_expert[a:a + n] == l).all()
                y[a:a + n] = (rows.x[a:a + n].float() @ local[l]).to(layer.y_dtype)
            return y

        errs = []
        with moecomm.MoELayer(comm, max_tokens=T, num_experts=E, experts_per_token=K, hidden=H,
                              dtype=torch.float32, prefill_tokens=P, expert_align=align) as layer:
            for step in range(4):
                m = int(torch.randint(T + 1, P + 1, (), generator=g)) if step % 2 == 0 else T
                x = torch.randn(m, H, generator=g)
                w, ids = _route(x, wr)
                layer.out.fill_(float("nan"))
                out = layer(x, ids, w, experts, grouped_experts=grouped)
                assert out.shape == (m, H)
                ref, mag = _dense(x, w, ids, we, torch.float32)
                errs.append(((out.float() - ref).abs() / (mag + 1e-6)).max().item())
            with pytest.raises(moecomm.MoecommInvalid, match="grouped_experts"):
                layer(torch.zeros(T + 1, H), torch.zeros(T + 1, K, dtype=torch.int64), torch.zeros(T + 1, K),
                      experts)
        return errs

    for rank, errs in enumerate(run_threads(ws, rank_fn)):
        assert max(errs) <= 1e-5, f"rank {rank}: max relative error {max(errs)} (MC_SEED={seed})"


def test_layer_refuses_int32_ids_unless_asked():
    def rank_fn(rank, comm):
        x = torch.randn(2, H)
        ids = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
        w = torch.full((2, K), 1.0 / K)
        with moecomm.MoELayer(comm, max_tokens=T, num_experts=E, experts_per_token=K, hidden=H,
                              dtype=torch.float32) as layer:
            with pytest.raises(moecomm.MoecommInvalid, match="indices: dtype must be int64"):
                layer(x, ids, w, lambda ex, c, s: torch.zeros_like(ex))
        with moecomm.MoELayer(comm, max_tokens=T, num_experts=E, experts_per_token=K, hidden=H,
                              dtype=torch.float32, index_dtype=torch.int32) as layer:
            out = layer(x, ids, w, lambda ex, c, s: ex.clone())  # identity experts: out = x
            assert torch.allclose(out, x)
        return True

    assert run_threads(1, rank_fn) == [True]
