"""torch CPU tensors and the torch.distributed bootstrap (skipped without torch)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import moecomm  # noqa: E402
from mc_ref import make_group_inputs  # noqa: E402
from mc_run import check_rank, one_round  # noqa: E402

H, MT, E, K = 16, 4, 4, 2


@pytest.fixture
def gloo_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_from_torch_with_tensors(rng, gloo_world):
    inp = make_group_inputs(rng, MT, E, K, H, 0, False)
    tin = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in inp.items()}
    with moecomm.Communicator.from_torch(timeout_ms=5000) as comm:
        with moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H,
                              token_bytes=H * 4, combine_in_dtype=torch.float32, combine_out_dtype=torch.float32) as a2a:
            bufs = (torch.from_numpy(a2a.alloc_expert_num_tokens()), torch.from_numpy(a2a.alloc_expert_x(np.float32)),
                    None, torch.from_numpy(a2a.alloc_expert_y()), torch.from_numpy(a2a.alloc_out_tokens()))
            got = one_round(a2a, 0, tin, bufs)
    got = tuple(None if g is None else np.asarray(g) for g in got)
    check_rank([inp], 0, 1, E, got, "fp32", "fp32")


def test_torch_bf16_tensor_accepted_and_gpu_refused():
    from moecomm._arrays import view
    assert view(torch.zeros(4, dtype=torch.bfloat16), "x").tag == "bf16"
    if torch.cuda.is_available():
        with pytest.raises(moecomm.MoecommInvalid, match="CPU tensor"):
            view(torch.zeros(4, device="cuda"), "x")


def _torch_rank(store, rank, groups, q):
    """One of two processes: gloo group over a file store, moecomm from it."""
    try:
        import torch.distributed as d

        d.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        with moecomm.Communicator.from_torch(timeout_ms=20000) as comm:
            with moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H,
                                  token_bytes=H * 4, combine_in_dtype="fp32", combine_out_dtype="fp32") as a2a:
                bufs = (a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(np.float32), None,
                        a2a.alloc_expert_y(), a2a.alloc_out_tokens())
                got = one_round(a2a, rank, groups[rank], bufs)
        d.destroy_process_group()
        q.put((rank, got, None))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, None, repr(e)))


def test_from_torch_two_processes(rng, tmp_path):
    """The out-of-band allgather through torch.distributed across two processes."""
    import multiprocessing as mp

    groups = [make_group_inputs(rng, MT, E, K, H, 0, False) for _ in range(2)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_torch_rank, args=(str(tmp_path / "store"), r, groups, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (got, err)) for r, got, err in (q.get(timeout=120) for _ in range(2)))
    for p in procs:
        p.join(60)
    for rank in range(2):
        got, err = results[rank]
        assert err is None, f"rank {rank}: {err}"
        check_rank(groups, rank, 1, E // 2, got, "fp32", "fp32")


def test_gpu_transport_refuses_host_arrays_by_name():
    """What a GPU transport checks before C sees anything (runs without a GPU)."""
    from moecomm._arrays import view
    with pytest.raises(moecomm.MoecommInvalid, match=r"dp_x: must be a torch tensor on cuda:0.*device cpu"):
        view(torch.zeros(4), "dp_x", device=0)
    with pytest.raises(moecomm.MoecommInvalid, match=r"indices: must be a torch tensor on cuda:0.*ndarray"):
        view(np.zeros(4, np.int32), "indices", device=0)
