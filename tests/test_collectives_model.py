"""Collectives as NCCL runs them (estimate/comm.py nccl_candidates, nccl_call): the algorithm
and protocol its tuner (NVIDIA/nccl src/graph/tuning.cc) picks by message size and rank count,
priced with its own latency constants (conventions.toml [efficiency.nccl])."""

import dataclasses

import numpy as np
import pytest

from trainplan.estimate import comm
from trainplan.estimate.collectives import collective_choice
from trainplan.estimate.hardware import hardware, nccl_tuning
from trainplan.estimate.time import step_derivation
from trainplan.plan import make_plan, resolve

US = 1e-6


def test_ring_latency_takes_a_step_per_rank():
    """tuning.cc: a ring all-gather over n ranks takes n - 1 steps, nodes - 1 of them across the
    network (14 us, Simple) and the others over NVLink (3.4 us, at least 3x the 1 us network
    overhead of an Intel host), after the 8.4 us base: over 1,536 H100 on 192 nodes,
    8.4 + 1,344 x 3.4 + 191 x 14 = 7,252 us. On the DGX A100's AMD hosts each NVLink step of a
    multi-node ring costs 3 x 2 us: 8.4 + 1,344 x 6 + 191 x 14 = 10,746.4 us."""
    for gpu, step, want in (("H100-SXM", 3.4, 7252.0), ("A100-80GB-SXM", 6.0, 10746.4)):
        t = nccl_tuning(gpu)
        times, lats, algos, protos = comm.nccl_candidates(comm.ALL_GATHER, 1e9, 1536, 192, 8, 180e9, t)
        simple = int(np.flatnonzero((algos == comm.RING) & (protos == comm.SIMPLE))[0])
        assert float(lats[simple]) == pytest.approx(want * US, rel=1e-12)
        assert want == pytest.approx(8.4 + 1344 * step + 191 * 14)
        # the time is that latency plus (n - 1)/n of the buffer at the bus bandwidth
        assert float(times[simple]) == pytest.approx(want * US + 1535 / 1536 * 1e9 / 180e9, rel=1e-12)


def test_protocol_follows_the_message_size_in_a_node():
    """8 H100 on NVLink (bus bandwidth 0.8 x 450 GB/s): a 1 KB all-reduce runs LL (6.6 +
    14 x 0.6 us), 4 MB LL128 (14 + 14 x 1.9 us, 0.92 of the bandwidth), 1 GB Simple (8.4 +
    14 x 3.4 us, all of it): each the cheapest of NCCL's own estimates."""
    t = nccl_tuning("H100-SXM")
    bw = 0.8 * 450e9
    got = {}
    for size in (1e3, 4e6, 1e9):
        secs, algo, proto, lat = comm.nccl_call(comm.ALL_REDUCE, size, 8, 1, 8, bw, t)
        got[size] = (int(algo), int(proto), float(lat))
        assert float(secs) <= float(np.min(comm.nccl_candidates(comm.ALL_REDUCE, size, 8, 1, 8, bw, t)[0]))
    assert got[1e3][1] == comm.LL and got[1e3][2] == pytest.approx((6.6 + 14 * 0.6) * US)
    assert got[4e6][:2] == (comm.RING, comm.LL128) and got[4e6][2] == pytest.approx((14 + 14 * 1.9) * US)
    assert got[1e9][:2] == (comm.RING, comm.SIMPLE) and got[1e9][2] == pytest.approx((8.4 + 14 * 3.4) * US)
    ll128 = comm.nccl_call(comm.ALL_REDUCE, 4e6, 8, 1, 8, bw, t)[0]
    assert float(ll128) == pytest.approx((14 + 14 * 1.9) * US + 2 * 7 / 8 * 4e6 / (0.92 * bw), rel=1e-12)


def test_all_reduce_over_many_nodes_takes_the_tree():
    """One rank on each of 1,024 nodes: the ring's all-reduce takes 2 x 1,023 network steps, the
    tree 2 log2(1,024) = 20 (tuning.cc: base + 2 x ((ppn - 1) x NVLink + log2(nodes) x network));
    a 1 MB all-reduce runs on the tree, at 8.4 + 20 x 14 us latency for Simple (LL 6.8 + 20 x 5,
    LL128 14 + 20 x 8.5)."""
    t = nccl_tuning("H100-SXM")
    secs, algo, proto, lat = comm.nccl_call(comm.ALL_REDUCE, 1e6, 1024, 1024, 1, 45e9, t)
    assert int(algo) == comm.TREE
    want = {comm.LL: 6.8 + 20 * 5.0, comm.LL128: 14 + 20 * 8.5, comm.SIMPLE: 8.4 + 20 * 14.0}[int(proto)]
    assert float(lat) == pytest.approx(want * US)
    ring = comm.nccl_candidates(comm.ALL_REDUCE, 1e6, 1024, 1024, 1, 45e9, t)
    assert float(secs) < float(np.min(ring[0][ring[2] == comm.RING]))


def test_ll128_crosses_nodes_where_the_gpu_and_its_nic_share_a_pcie_switch():
    """[efficiency.nccl] ll128_across_nodes = true (DGX/HGX-class servers put each GPU and its NIC
    under one PCIe switch, where ncclTopoTuneModel enables LL128 across nodes): a call crossing
    nodes may run LL128; a system whose NICs hang off the CPU (false) prices such calls with LL
    or Simple only. Inside a node LL128 is always a candidate."""
    t = nccl_tuning("H100-SXM")
    assert t.ll128_across_nodes
    times, _, algos, protos = comm.nccl_candidates(comm.ALL_GATHER, 1e8, 64, 8, 8, 360e9, t)
    assert np.all(np.isfinite(times[protos == comm.LL128]))
    off = dataclasses.replace(t, ll128_across_nodes=False)
    times, _, algos, protos = comm.nccl_candidates(comm.ALL_GATHER, 1e8, 64, 8, 8, 360e9, off)
    assert np.all(np.isinf(times[protos == comm.LL128]))
    times, _, _, protos = comm.nccl_candidates(comm.ALL_GATHER, 1e8, 8, 1, 8, 360e9, off)
    assert np.all(np.isfinite(times[protos == comm.LL128]))


def test_calls_across_nodes_keep_to_nccls_per_channel_ceilings():
    """A channel that crosses nodes runs at one NIC's speed, the highest of NCCL's search speeds
    the NIC reaches (search.cc: 48 GB/s for 400 Gb/s, 24 for 200 Gb/s), and NCCL caps what a
    channel carries (tuning.cc): ring LL128 36.7 GB/s on Hopper, 20 on Ampere; the tree 36.0 on
    Hopper beyond two nodes (41.4 at two), tree LL128 29.0. So across H100 nodes ring LL128 gets
    36.7 / 48 of the bus bandwidth, not 0.92; on A100 with 200 Gb/s NICs 20 / 24; in a node 0.92."""
    t = nccl_tuning("H100-SXM", 400.0)
    assert t.ring_ll128_cap == pytest.approx(36.7 / 48)
    assert t.tree_cap == pytest.approx((41.4 / 48, 36.0 / 48))
    assert t.tree_ll128_cap == pytest.approx((36.7 / 48, 29.0 / 48))
    assert nccl_tuning("A100-80GB-SXM", 200.0).ring_ll128_cap == pytest.approx(20.0 / 24)
    bw = 360e9
    times, lats, algos, protos = comm.nccl_candidates(comm.ALL_GATHER, 1e8, 64, 8, 8, bw, t)
    ll128 = int(np.flatnonzero((algos == comm.RING) & (protos == comm.LL128))[0])
    assert float(times[ll128]) == pytest.approx(float(lats[ll128]) + 63 / 64 * 1e8 / (bw * 36.7 / 48), rel=1e-12)
    times, lats, algos, protos = comm.nccl_candidates(comm.ALL_GATHER, 1e8, 8, 1, 8, bw, t)
    ll128 = int(np.flatnonzero((algos == comm.RING) & (protos == comm.LL128))[0])
    assert float(times[ll128]) == pytest.approx(float(lats[ll128]) + 7 / 8 * 1e8 / (bw * 0.92), rel=1e-12)
    # the tree's Simple all-reduce of 256 MB (no size correction left: 0.9) over 1,024 nodes,
    # one NIC each: 0.75 of the bus bandwidth each way instead of NCCL's 0.92 share
    times, lats, algos, protos = comm.nccl_candidates(comm.ALL_REDUCE, 2.0 ** 28, 1024, 1024, 1, 45e9, t)
    tree = int(np.flatnonzero((algos == comm.TREE) & (protos == comm.SIMPLE))[0])
    assert float(times[tree]) == pytest.approx(float(lats[tree]) + 2 * 2.0 ** 28 / (45e9 * 0.75 * 0.9), rel=1e-12)
    # no NIC, or an accelerator NCCL does not tune for: no ceiling
    assert nccl_tuning("H100-SXM").ring_ll128_cap == np.inf
    assert nccl_tuning("MI300X", 400.0).ring_ll128_cap == np.inf


def test_array_and_scalar_agree():
    """Search evaluates millions of layouts through the same code: arrays of group sizes give,
    element by element, what each scalar gives."""
    t = nccl_tuning("A100-80GB-SXM")
    n = np.array([2.0, 8.0, 64.0, 1536.0])
    nodes = np.ceil(n / 8)
    per_node = np.minimum(n, 8)
    size = np.array([1e3, 1e6, 1e8, 1e9])
    secs, algo, proto, lat = comm.nccl_call(comm.ALL_GATHER, size, n, nodes, per_node, 180e9, t)
    for i in range(len(n)):
        one = comm.nccl_call(comm.ALL_GATHER, size[i], n[i], nodes[i], per_node[i], 180e9, t)
        assert (float(secs[i]), int(algo[i]), int(proto[i]), float(lat[i])) == pytest.approx(
            (float(one[0]), int(one[1]), int(one[2]), float(one[3])))


def test_explain_names_each_groups_algorithm():
    """`plan --explain` (step_derivation's nccl_algorithms) names the algorithm and protocol of
    every collective group: the TP all-reduce in a node and the data-parallel all-reduce of
    Megatron's PTD-P layout over 1,536 A100."""
    lay = resolve(make_plan(model="megatron-175b", gpu="A100-80GB-SXM", gpus=1536, tp=8, pp=12,
                            schedule="interleaved", vpp=2, framework="megatron", gbs=1536, seq_len=2048,
                            recompute="full", precision="fp16"))
    algos = step_derivation(lay)["nccl_algorithms"]
    assert set(algos) == {"TP all-reduce", "DP all-reduce"}
    # 2,048 tokens x 12,288 x 2 bytes = 50 MB among 8 GPUs on NVLink: the ring, Simple
    assert algos["TP all-reduce"] == "ring/Simple"
    assert algos["TP all-reduce"] == collective_choice(hardware(lay), comm.ALL_REDUCE, 2048 * 12288 * 2, 8, 1, 8)
