"""Collectives on a bandwidth hierarchy (DESIGN §3).

Time of a collective over n ranks moving a buffer of S bytes per rank:

    t = factor(n) · S / busbw + latency

with the nccl-tests bus-bandwidth factors (doc/PERFORMANCE.md): all-reduce 2(n-1)/n,
all-gather, reduce-scatter and all-to-all (n-1)/n, send/recv 1. busbw is the achieved bus
bandwidth of the slowest link the group spans: NVLink inside a node (ring collectives reach
~80% of the unidirectional NVLink bandwidth), the NIC across nodes (~90% of line rate); with
NVLS/SHARP in-network reduction the all-reduce factor drops to (n-1)/n.

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
    """Seconds for one collective; zero for a group of one."""
    n = np.asarray(n, dtype=float)
    return (bus_factor(kind, n, sharp) * nbytes / busbw + latency) * (n > 1)


def group_busbw(size, stride, gpus_per_node, nvlink_busbw, nic_busbw):
    """Achieved bus bandwidth of a group of `size` ranks placed `stride` GPUs apart.

    Inside one node it is NVLink's. Across nodes NCCL runs one ring per NIC, so the group
    gets the NICs of all its ranks on a node together (nccl-tests / ml-engineering: 4 x 8
    B200 with 8 x 400G reach 382 GB/s bus bandwidth), bounded by NVLink: a tensor-parallel-
    style stride that leaves one rank per node gets one NIC."""
    size, stride = np.asarray(size, dtype=float), np.asarray(stride, dtype=float)
    span = size * stride
    per_node = np.clip(np.floor(gpus_per_node / np.maximum(stride, 1)), 1, size)
    across = np.minimum(nvlink_busbw, per_node * nic_busbw)
    return np.where(span <= gpus_per_node, nvlink_busbw, across)
