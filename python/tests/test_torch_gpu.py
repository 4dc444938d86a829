"""moecomm.MoELayer end to end on GPUs (skipped without CUDA): router top-k
(int64, as torch.topk returns it), dispatch, per-expert MLP on the batched
layout with torch.bmm, combine; against a dense single-process reference of
the same layer. EP1 in this process; EP2 and EP4 as processes, rank r on
GPU r % (GPUs visible), several on a GPU under MPS (run under
scripts/mc-launch.sh, which starts it); over nvshmem and over p2p; eager,
then the same layer captured as a CUDA graph and replayed on fresh inputs,
then calls of 3 x max_tokens through the layer's expert-sorted handle
(prefill_tokens), the experts on contiguous rows. Each run prints its max
relative error."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import moecomm  # noqa: E402

H, F, E, K, T = 256, 128, 16, 4, 48  # hidden, expert MLP width, experts, top-k, tokens per rank
TOL = 0.02  # per element, of sum_k |w y|: bf16 expert outputs, pre-reduced rows rounded to bf16 on the wire


def weights(device):
    """Router and expert weights, the same on every rank (a fixed seed)."""
    g = torch.Generator(device="cpu").manual_seed(1234)
    wr = torch.randn(H, E, generator=g) / H ** 0.5
    w1 = torch.randn(E, H, F, generator=g) / H ** 0.5
    w2 = torch.randn(E, F, H, generator=g) / F ** 0.5
    return wr.to(device), w1.to(device), w2.to(device)


def tokens(rank, step, device, m=T):
    g = torch.Generator(device="cpu").manual_seed(1000 * rank + step + int(os.environ.get("MC_SEED", "7")))
    return torch.randn(m, H, generator=g).to(torch.bfloat16).to(device)


def route(x, wr):
    logits = x.float() @ wr
    w, idx = torch.topk(torch.softmax(logits, dim=-1), K, dim=-1)
    return (w / w.sum(-1, keepdim=True)).float().contiguous(), idx.contiguous()  # int64, as topk gives it


def expert_mlp(x, w1, w2):
    """x [n][cap][H] (any float dtype) -> [n][cap][H] bf16, computed in fp32."""
    return torch.bmm(torch.nn.functional.gelu(torch.bmm(x.float(), w1)), w2).to(torch.bfloat16)


def dense_reference(x, w, idx, w1, w2):
    """Every token through its experts, here, in fp32 from the same bf16 outputs."""
    m = x.shape[0]
    y = expert_mlp(x.unsqueeze(0).expand(E, -1, -1), w1, w2).float()  # [E][m][H]
    out = torch.zeros(m, H, device=x.device)
    for k in range(K):
        out += w[:, k:k + 1] * y[idx[:, k].long(), torch.arange(m, device=x.device)]
    scale = torch.zeros(m, H, device=x.device)  # per element: sum over k of |w y|
    for k in range(K):
        scale += (w[:, k:k + 1] * y[idx[:, k].long(), torch.arange(m, device=x.device)]).abs()
    return out, scale


def run_rank(rank, world, store, results, transport="nvshmem"):
    torch.cuda.set_device(rank % torch.cuda.device_count())  # as scripts/mc-launch.sh shares GPUs (and MPS) out
    dev = torch.cuda.current_device()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        wr, w1, w2 = weights(dev)
        L = E // world
        w1l, w2l = w1[rank * L:(rank + 1) * L], w2[rank * L:(rank + 1) * L]
        errs = []
        with moecomm.Communicator.from_torch(transport=transport, timeout_ms=20000) as comm:
            assert comm.transport == transport
            with moecomm.MoELayer(comm, max_tokens=T, num_experts=E, experts_per_token=K, hidden=H,
                                  dtype=torch.bfloat16, out_dtype=torch.float32, prefill_tokens=3 * T,
                                  expert_align=8) as moe:
                out = moe.out[:T]
                x = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
                w = torch.empty(T, K, dtype=torch.float32, device=dev)
                idx = torch.empty(T, K, dtype=torch.int64, device=dev)

                def layer():
                    moe(x, idx, w, lambda xe, cnt, _scale: expert_mlp(xe, w1l, w2l))

                def check(step):
                    ref, scale = dense_reference(x, w, idx, w1, w2)
                    torch.cuda.synchronize()
                    moe.a2a.check()
                    errs.append(((out - ref).abs() / (scale + 1e-6)).max().item())  # NaN (poison left) fails

                for step in range(3):  # eager
                    x.copy_(tokens(rank, step, dev))
                    w_, idx_ = route(x, wr)
                    w.copy_(w_), idx.copy_(idx_)
                    out.fill_(float("nan"))  # poison
                    layer()
                    check(step)
                eager = max(errs)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    layer()  # warm-up on the capture stream (torch's rule)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    layer()
                errs.clear()
                for step in range(3, 6):  # replays on fresh inputs, copied in place
                    x.copy_(tokens(rank, step, dev))
                    w_, idx_ = route(x, wr)
                    w.copy_(w_), idx.copy_(idx_)
                    out.fill_(float("nan"))
                    g.replay()
                    check(step)
                graph = max(errs)
                torch.cuda.synchronize()

                def grouped(rows):  # each local expert's contiguous rows through its MLP
                    y = torch.empty(rows.rows, H, dtype=torch.bfloat16, device=dev)
                    off, cnt = rows.expert_offset.tolist(), rows.expert_count.tolist()
                    for l in range(L):
                        if cnt[l]:
                            y[off[l]:off[l] + cnt[l]] = expert_mlp(rows.x[off[l]:off[l] + cnt[l]].unsqueeze(0),
                                                                   w1l[l:l + 1], w2l[l:l + 1])[0]
                    return y

                errs.clear()
                for step in range(6, 8):  # prefill: past max_tokens, the expert-sorted layout
                    xp = tokens(rank, step, dev, 3 * T)
                    wp, idxp = route(xp, wr)
                    moe.out.fill_(float("nan"))
                    got = moe(xp, idxp, wp, None, grouped_experts=grouped)
                    ref, scale = dense_reference(xp, wp, idxp, w1, w2)
                    torch.cuda.synchronize()
                    moe.prefill.check()
                    errs.append(((got - ref).abs() / (scale + 1e-6)).max().item())
                prefill = max(errs)
        results[rank] = (eager, graph, prefill)
    finally:
        dist.destroy_process_group()


def _spawned(rank, world, store, q, transport):
    res = {}
    try:
        run_rank(rank, world, store, res, transport)
        q.put((rank, res[rank], None))
    except Exception as e:  # report, do not hang the parent
        q.put((rank, None, repr(e)))


@pytest.mark.parametrize("transport", ["nvshmem", "p2p"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_layer_on_gpu(world, transport):
    store = tempfile.mktemp(prefix="mc-torch-store-")
    if world == 1:
        res = {}
        run_rank(0, 1, store, res, transport)
        got = [(0, res[0], None)]
    else:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_spawned, args=(r, world, store, q, transport)) for r in range(world)]
        for p in procs:
            p.start()
        got = [q.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
    for rank, errs, why in sorted(got):
        assert why is None, f"rank {rank}: {why}"
        print(f"{transport} EP{world} on {min(world, torch.cuda.device_count())} GPU(s) rank {rank}: max relative error eager {errs[0]:.3g}, CUDA graph {errs[1]:.3g}, prefill {errs[2]:.3g}")
        assert max(errs) <= TOL, f"rank {rank}: {errs} over {TOL}"
