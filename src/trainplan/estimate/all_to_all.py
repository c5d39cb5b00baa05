"""Expert-parallel all-to-all: an MoE layer's dispatch and combine on NVLink and the NICs.

A rank of an expert-parallel group of `ep` ranks sends each of its tokens' top-k copies to the
ranks hosting the chosen experts. With routing uniform over the experts, a copy stays on the
rank with probability 1/ep, goes to another rank of the same node with (per_node - 1)/ep and
crosses to another node with 1 - per_node/ep: one minus the share of the experts on this node
(`per_node` of the group's ranks share a node). What crosses leaves through the rank's own NIC
(one per GPU); NCCL's all-to-all, with PXN, and DeepEP's kernels forward it over NVLink to the
rail-local GPU first, so NVLink carries every copy that leaves the rank:

    t = max(cross_bytes / NIC, nvlink_bytes / NVLink) + latency

Node-limited routing (DeepSeek-V3 §2.1.2: each token to experts on at most M nodes, dispatched
by DeepEP's normal kernels once per destination node and forwarded inside it over NVLink) sends
a token to M·(1 - 1/N) other nodes on average when its M nodes are spread over the group's N,
instead of top_k·(1 - per_node/ep) copies. Without a limit the dispatch is NCCL's all-to-all,
one transfer per copy (Megatron-Core's alltoall token dispatcher).

Bandwidths: the NIC at the accelerator's achieved fraction (conventions.toml [efficiency] nic,
DeepEP's H800 internode kernels reach 43-58 GB/s of a CX7's ~50 GB/s); NVLink at
[efficiency.all_to_all] nvlink (DeepEP's intranode kernels: 153 GB/s on H800). All functions
take numbers or numpy arrays.
"""

from __future__ import annotations

import numpy as np

from .comm import group_nodes, ranks_per_node
from .scalars import floats, maximum, minimum, where


def copies_crossing(ep, per_node, top_k, node_limit=None):
    """Transfers per token that leave the node: top_k·(1 - per_node/ep) copies under NCCL's
    all-to-all, or under node-limited routing (`node_limit` M > 0) one per other destination node,
    M·(1 - 1/N) of the N nodes the group spans (M capped at N)."""
    ep = maximum(floats(ep), 1.0)
    nodes = maximum(np.ceil(ep / maximum(per_node, 1.0)), 1.0)
    plain = top_k * (1.0 - per_node / ep)
    if node_limit is None:
        return plain
    m = minimum(float(node_limit), nodes)
    return minimum(plain, m * (1.0 - 1.0 / nodes))


def dispatch_time(token_bytes, tokens, top_k, ep, stride, gpn, nvlink, nic, latency, node_limit=None):
    """Seconds of one dispatch (or combine: the same bytes the other way) of `tokens` tokens of
    `token_bytes` each over an expert-parallel group of `ep` ranks placed `stride` GPUs apart,
    `nvlink` and `nic` the achieved bytes/s per GPU, `latency` one call's; zero for a group of one."""
    ep = floats(ep)
    per_node = ranks_per_node(ep, stride, gpn)
    nodes = group_nodes(ep, stride, gpn, per_node)
    cross = tokens * token_bytes * copies_crossing(ep, per_node, top_k, node_limit)
    # every copy that leaves the rank passes NVLink (to its rank, or to the rail-local GPU)
    on_nvlink = tokens * token_bytes * top_k * (1.0 - 1.0 / maximum(ep, 1.0))
    wire = maximum(where(nodes > 1, cross / nic, 0.0), on_nvlink / nvlink)
    return (wire + latency) * (ep > 1)


def crossing_share(ep, stride, gpn):
    """The share of a rank's routed copies that leave its node under uniform routing:
    1 - (experts on this node / all experts)."""
    ep = maximum(floats(ep), 1.0)
    return 1.0 - ranks_per_node(ep, stride, gpn) / ep
