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

import numpy as np

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
