"""The unique-id socket bootstrap with ranks as spawned processes."""
import multiprocessing as mp

import numpy as np

import moecomm
from mc_ref import make_group_inputs
from mc_run import check_rank, one_round

WS, H, MT, E, K = 2, 16, 4, 4, 2


def rank_main(uid, rank, groups, q):
    try:
        comm = moecomm.Communicator.from_unique_id(uid, rank, WS, bootstrap_timeout_ms=20000, timeout_ms=20000)
        with moecomm.AllToAll(comm, max_tokens=MT, num_experts=E, experts_per_token=K, hidden=H, token_bytes=H * 4,
                              combine_in_dtype="bf16", combine_out_dtype="fp32") as a2a:
            bufs = (a2a.alloc_expert_num_tokens(), a2a.alloc_expert_x(np.float32), None,
                    a2a.alloc_expert_y(), a2a.alloc_out_tokens())
            got = one_round(a2a, rank, groups[rank], bufs)
        comm.destroy()
        q.put((rank, got, None))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, None, repr(e)))


def test_socket_bootstrap_two_processes(rng):
    groups = [make_group_inputs(rng, MT, E, K, H, 0, True) for _ in range(WS)]
    uid = moecomm.unique_id()  # this process is rank 0: it holds the listening socket
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=rank_main, args=(uid, 1, groups, q))
    child.start()
    rank_main(uid, 0, groups, q)
    results = dict((r, (got, err)) for r, got, err in (q.get(timeout=60) for _ in range(WS)))
    child.join(30)
    assert child.exitcode == 0
    for rank in range(WS):
        got, err = results[rank]
        assert err is None, f"rank {rank}: {err}"
        check_rank(groups, rank, 1, E // WS, got, "bf16", "fp32")
