"""Collectives on a bandwidth hierarchy (DESIGN §3).

Time of a collective over n ranks moving a buffer of S bytes per rank:

    t = factor(n) · S / busbw + calls · latency(n, nodes)

with the nccl-tests bus-bandwidth factors (doc/PERFORMANCE.md): all-reduce 2(n-1)/n,
all-gather, reduce-scatter and all-to-all (n-1)/n, send/recv 1. busbw is the achieved bus
bandwidth of the slowest link the group spans: NVLink inside a node (ring collectives reach
~80% of the unidirectional NVLink bandwidth), the NIC across nodes (~90% of line rate); with
NVLS/SHARP in-network reduction the all-reduce factor drops to (n-1)/n. The latency of a call
is NCCL's own model of its ring (ring_latency): it grows with every hop, so an FSDP gather issued
per layer over hundreds of GPUs costs milliseconds before a byte of bandwidth.

All functions take numbers or numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .memo import cached_hash

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, SEND_RECV = range(5)


def bus_factor(kind: int, n, sharp=False):
    """Bytes on the busiest link per byte of buffer (kind is one of the constants above;
    n, the group size, may be an array)."""
    n = np.asarray(n, dtype=float)
    if kind == SEND_RECV:
        return (n > 1) * 1.0
    frac = (n - 1) / np.maximum(n, 1)
    if kind == ALL_REDUCE:
        return np.where(sharp, frac, 2 * frac)
    return frac


def collective_time(kind: int, nbytes, n, busbw, latency, sharp=False):
    """Seconds for a collective moving `nbytes` per rank, `latency` its calls' latency in all
    (ring_latency times the calls it is issued in); zero for a group of one."""
    n = np.asarray(n, dtype=float)
    return (bus_factor(kind, n, sharp) * nbytes / busbw + latency) * (n > 1)


def ring_latency(kind: int, n, nodes, base, intra_step, inter_step):
    """Seconds of latency in one call over n ranks on `nodes` nodes, by NCCL's cost model of its
    ring (src/graph/tuning.cc, Simple protocol): base + hops inside a node x intra_step + hops
    between nodes x inter_step. All-gather and reduce-scatter go n - 1 hops, nodes - 1 of them
    between nodes; all-reduce twice that; send/recv and an all-to-all's parallel sends one."""
    n, nodes = np.asarray(n, dtype=float), np.asarray(nodes, dtype=float)
    if kind in (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE):
        rounds = 2 if kind == ALL_REDUCE else 1
        hops, between = rounds * (n - 1), rounds * (nodes - 1)
    else:
        hops, between = np.minimum(n - 1, 1.0), (nodes > 1) * 1.0
    return base + (hops - between) * intra_step + between * inter_step


def nvls_latency(nodes, nvls_step, tree_net_step):
    """Seconds of latency in one all-reduce done in the network (NCCL's NVLS in a node, its NVLS
    tree across nodes: src/graph/tuning.cc): one NVLink SHARP step, plus 2 log2(nodes) network
    steps of the tree across nodes."""
    nodes = np.asarray(nodes, dtype=float)
    return nvls_step + 2 * np.log2(np.maximum(nodes, 1.0)) * tree_net_step


def ranks_per_node(size, stride, gpus_per_node):
    """How many of a group's `size` ranks, placed `stride` GPUs apart, share a node."""
    return np.minimum(np.maximum(np.floor(gpus_per_node / np.maximum(stride, 1)), 1), np.maximum(size, 1))


def group_nodes(size, stride, gpus_per_node, per_node=None):
    """Nodes a group of `size` ranks placed `stride` GPUs apart spans (a group that fits in one
    node has all its ranks on it); `per_node`, ranks_per_node's value if already known."""
    per_node = ranks_per_node(size, stride, gpus_per_node) if per_node is None else per_node
    return np.ceil(np.asarray(size, dtype=float) / per_node)


def group_busbw(size, stride, gpus_per_node, nvlink_busbw, nic_busbw, per_node=None):
    """Achieved bus bandwidth of a group of `size` ranks placed `stride` GPUs apart.

    Inside one node it is NVLink's. Across nodes NCCL runs one ring per NIC, so the group
    gets the NICs of all its ranks on a node together (nccl-tests / ml-engineering: 4 x 8
    B200 with 8 x 400G reach 382 GB/s bus bandwidth), bounded by NVLink: a tensor-parallel-
    style stride that leaves one rank per node gets one NIC."""
    per_node = ranks_per_node(size, stride, gpus_per_node) if per_node is None else per_node
    span = np.asarray(size, dtype=float) * stride
    return np.where(span <= gpus_per_node, nvlink_busbw, np.minimum(nvlink_busbw, per_node * nic_busbw))


# ---- NCCL's choice of algorithm and protocol (src/graph/tuning.cc) -------------------------
RING, TREE, NVLS, PAT = range(4)
ALGORITHMS = ("ring", "tree", "nvls", "pat")
LL, LL128, SIMPLE = range(3)
PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class NcclTuning:
    """NCCL's tuning constants (conventions.toml [efficiency.nccl], seconds; per protocol
    LL, LL128, Simple): ncclTunerConstantsDefaults and ncclTopoTuneModel in src/graph/tuning.cc."""

    ring_base: tuple
    tree_base: tuple
    ring_nvlink: tuple
    tree_nvlink: tuple
    ring_net: tuple
    tree_net: tuple
    net_overhead: float  # per network step a ring launches (x simple_overhead_factor for Simple)
    simple_overhead_factor: float
    ring_plateau: float  # multi-node ring all-reduce, Simple: latency x this (Ampere and later)
    ll_share: float  # LL's bus bandwidth share (8-byte lines carrying 4 bytes of data)
    ll_max_bw: tuple  # ... capped at this many bytes/s (llMaxBws): in one node, on two, on more
    ll128_share: float  # LL128: 120 of 128 bytes per line carry data
    ll128_across_nodes: bool  # whether calls crossing nodes may run LL128
    tree_share: float  # tree all-reduce: its bus bandwidth share, before the protocol's
    tree_ll_share: float
    tree_ll128_share: float
    tree_correction: tuple  # per protocol, by log2(bytes / 64) from 0: treeCorrectionFactor
    pat_base: float
    pat_per_rank: float
    pat_net_divisor: float
    pat_share: float
    nvls: float  # NVLS (in-network reduction) step, and its tree's network step
    nvls_tree_net: float
    # across nodes, what NCCL's per-channel ceilings leave of a channel's network speed: ring
    # LL128, and the tree's and tree LL128's at two nodes and at more (inf: no ceiling)
    ring_ll128_cap: float = float("inf")
    tree_cap: tuple = (float("inf"), float("inf"))
    tree_ll128_cap: tuple = (float("inf"), float("inf"))

    def __hash__(self) -> int:  # the memoised collectives key on it: hashed once
        return cached_hash(self)


def _log2i(x):
    return np.floor(np.log2(np.maximum(x, 1.0)))



def _ring_latency(t, p: int, ar: bool, multi, one_per_node, intra_steps, inter):
    """A ring's latency under protocol p (NCCL tuning.cc: base + intra-node steps x the NVLink
    step, paid at the network's overhead on a multi-node ring, + inter-node steps x the network
    step, the tree's when one rank per node; a multi-node all-reduce's Simple ring x the
    plateau factor); numbers or arrays alike."""
    overhead = t.net_overhead * (t.simple_overhead_factor if p == SIMPLE else 1.0)
    nvl = t.ring_nvlink[p]
    intra = nvl + multi * (max(nvl, overhead) - nvl)  # a multi-node ring's NVLink step
    net = t.ring_net[p] + one_per_node * (t.tree_net[p] - t.ring_net[p])
    lat = t.ring_base[p] + intra_steps * intra + inter * net
    if ar and p == SIMPLE:
        lat = lat * (1.0 + multi * (t.ring_plateau - 1.0))
    return lat


def nccl_candidates(kind: int, nbytes, n, nodes, per_node, busbw, t: NcclTuning, sharp=False, stacked=True):
    """Seconds of one call moving `nbytes` per rank by each algorithm and protocol NCCL could
    run (candidates on a new last axis, inf where NCCL would not), their latencies, and their
    codes (algorithm, protocol). Each is NCCL's own estimate, latency + bytes / bandwidth (ncclTopoGetAlgoTime),
    over this model's achieved bus bandwidth of the group's slowest link:

    * ring, every protocol: (n - 1) steps, 2(n - 1) for an all-reduce, nodes - 1 of them (twice)
      between nodes at the network latency (the tree's when one rank sits on each node), the
      others at the NVLink one, at least the network's post overhead; a multi-node all-reduce's
      Simple latency x1.4 (its "plateau"). LL moves half the bytes per line, capped at NCCL's LL
      ceiling; LL128 120 of 128 (across nodes only where `ll128_across_nodes`, and no more than
      NCCL's per-channel LL128 ceiling leaves of a network channel: `ring_ll128_cap`).
    * tree (all-reduce only): 2 x (a chain through the node's ranks + log2(nodes) network hops),
      half the bus bandwidth each way (x0.92, NCCL's tree share, across nodes at most its
      per-channel ceiling's share, `tree_cap`; LL128 x120/128 at most `tree_ll128_cap`), with its
      medium-size correction.
    * PAT (all-gather / reduce-scatter with one rank per node): log2(nodes) network steps at a
      3.5th of their latency, 2.8 us per rank, 0.75 of the bandwidth.
    * NVLS (all-reduce done in the network, `sharp`): one NVLink SHARP step and its tree across
      nodes, the all-reduce's bus factor halved.
    """
    n, nodes, per_node = (np.asarray(x, dtype=float) for x in (n, nodes, per_node))
    nbytes = np.asarray(nbytes, dtype=float)
    multi = nodes > 1
    ar = kind == ALL_REDUCE
    rounds = 2.0 if ar else 1.0
    inter = rounds * (nodes - 1)  # zero in one node
    intra_steps = rounds * (n - 1) - inter
    one_per_node = per_node <= 1
    ll_max = np.where(nodes <= 1, t.ll_max_bw[0], np.where(nodes <= 2, t.ll_max_bw[1], t.ll_max_bw[2]))
    # scalars where they can be: search prices millions of layouts through this
    times, lats, algos, protos = [], [], [], []

    def add(seconds, algo, proto, lat):
        times.append(seconds)
        lats.append(lat)
        algos.append(algo)
        protos.append(proto)

    if kind in (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE):
        moved = bus_factor(kind, n) * nbytes
        wire = moved / busbw  # Simple's bytes time
        for p in (LL, LL128, SIMPLE):
            lat = _ring_latency(t, p, ar, multi, one_per_node, intra_steps, inter)
            if p == SIMPLE:
                secs = lat + wire
            elif p == LL128:
                secs = lat + wire / np.where(multi, min(t.ll128_share, t.ring_ll128_cap), t.ll128_share)
                if not t.ll128_across_nodes:
                    secs = np.where(multi, np.inf, secs)
            else:
                secs = lat + moved / np.minimum(ll_max, t.ll_share * busbw)
            add(secs, RING, p, lat)
    if ar:
        size_class = np.minimum(_log2i(np.maximum(nbytes, 64.0) / 64), len(t.tree_correction[0])).astype(int)
        log_nodes = _log2i(nodes)
        two = nodes <= 2  # NCCL's ceilings at two nodes, else at more
        tree_bw = busbw * np.where(multi, np.minimum(t.tree_share, np.where(two, *t.tree_cap)), t.tree_share)
        tree_ll128_max = busbw * np.where(multi, np.where(two, *t.tree_ll128_cap), np.inf)
        for p in (LL, LL128, SIMPLE):
            corr = np.append(np.asarray(t.tree_correction[p], dtype=float), 1.0)[size_class]
            lat = t.tree_base[p] + 2 * ((per_node - 1) * t.tree_nvlink[p] + log_nodes * t.tree_net[p])
            bw = {LL: np.minimum(tree_bw * t.tree_ll_share, ll_max),
                  LL128: np.minimum(tree_bw * (7.0 / 9.0 + multi * (t.tree_ll128_share - 7.0 / 9.0)), tree_ll128_max),
                  SIMPLE: tree_bw}[p]
            secs = lat + 2 * nbytes / (bw * corr)  # the tree's algorithm bandwidth: half its bus bandwidth
            if p == LL128 and not t.ll128_across_nodes:
                secs = np.where(multi, np.inf, secs)
            add(secs, TREE, p, lat)
        if sharp:
            lat = nvls_latency(nodes, t.nvls, t.nvls_tree_net)
            add(lat + bus_factor(kind, n, True) * nbytes / busbw, NVLS, SIMPLE, lat)
    if kind in (ALL_GATHER, REDUCE_SCATTER) and np.any(multi & one_per_node):
        lat = t.pat_base + _log2i(nodes) * t.tree_net[SIMPLE] / t.pat_net_divisor + n * t.pat_per_rank
        add(np.where(multi & one_per_node, lat + nbytes / (t.pat_share * busbw), np.inf), PAT, SIMPLE, lat)
    if not stacked:  # (nccl_call takes the minimum as it goes)
        return times, lats, np.array(algos), np.array(protos)
    stack = lambda xs: np.stack(np.broadcast_arrays(*xs), axis=-1)  # noqa: E731
    return stack(times), stack(lats), np.array(algos), np.array(protos)


def nccl_call(kind: int, nbytes, n, nodes, per_node, busbw, t: NcclTuning, sharp=False):
    """(seconds, algorithm, protocol, latency) of one call of `kind` moving `nbytes` per rank over
    n ranks as NCCL runs it: the fastest of `nccl_candidates` (NCCL picks by the same estimate),
    zero for a group of one. Send/recv and all-to-all (NCCL's grouped point-to-point) keep the
    ring's one-hop Simple latency."""
    n = np.asarray(n, dtype=float)
    if kind not in (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE):
        lat = ring_latency(kind, n, nodes, t.ring_base[SIMPLE], t.ring_nvlink[SIMPLE], t.ring_net[SIMPLE])
        secs = (bus_factor(kind, n) * np.asarray(nbytes, dtype=float) / busbw + lat) * (n > 1)
        return secs, np.zeros(np.shape(secs), dtype=int), np.full(np.shape(secs), SIMPLE), lat * (n > 1)
    times, lats, algos, protos = nccl_candidates(kind, nbytes, n, nodes, per_node, busbw, t, sharp, stacked=False)
    secs, lat = times[0], lats[0]
    code = np.zeros(np.shape(secs), dtype=int)
    for i in range(1, len(times)):  # the running minimum: the first of equal candidates wins, as argmin
        better = times[i] < secs
        secs, lat = np.where(better, times[i], secs), np.where(better, lats[i], lat)
        code = np.where(better, i, code)
    return secs * (n > 1), algos[code], protos[code], lat * (n > 1)
