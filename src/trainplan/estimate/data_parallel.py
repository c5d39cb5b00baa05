"""The data-parallel share of a step (`time.step_from_stages`): the data-parallel group's
collectives for one pass, what they expose beside the compute of the micro-batches, the
framework's passes over gradients and gathered parameters, the parameters' fetches from the host,
and the optimizer step, on the GPU or offloaded to the host. Functions take numbers or numpy
arrays (one plan's scalars, search's layouts); the terms one micro-batch sets are memoised for a
plan's scalars, which the global batch does not change.
"""

from __future__ import annotations

from ..plan import DTYPE_BYTES, conventions
from . import comm
from .collectives import (
    collective,
    collective_terms,
    overlapped,
    recompute_regathered,
    zero3_exposed,
)
from .hardware import Hardware
from .memo import Memo, scalar_call
from .scalars import any_, floats, maximum, where

_OVERLAPS = Memo(1024)  # one plan's `_dp_overlaps`


def offloaded_optimizer(hw: Hardware, r, *, shard_params, reductions, backward, overlap_dp, ranks_per_host,
                        params_on_host=False):
    """Seconds a step spends on an optimizer offloaded to the host (conventions.toml
    [offload]): the rank's gradient partition going to the host (the fp32 copy at the
    accumulation boundary; before it, under ZeRO-2's reduction in every micro-batch, each
    micro-batch's gradient through the host and back in its own dtype), each copy beside that
    micro-batch's backward; the step on the host, memory-bound, for all `ranks_per_host` ranks a
    host serves at once; and the updated 16-bit parameters back to the GPU (unless they live on
    the host, `params_on_host`, and go with the next gathers)."""
    off = conventions()["offload"]
    last = shard_params * off["grad_to_host_bytes"] / hw.h2d
    earlier = shard_params * 2 * r.grad_bytes / hw.h2d
    copies = where(overlap_dp, (reductions - 1) * overlapped(earlier, backward, hw.overlap_slowdown)
                      + overlapped(last, backward, hw.overlap_slowdown), (reductions - 1) * earlier + last)
    # the fused step's bytes per parameter: the gradient, and the master copy and state read
    # and written (as `opt_bytes` on the GPU), times the host implementation's passes
    fp32 = DTYPE_BYTES["fp32"]
    host_step = ranks_per_host * shard_params * (fp32 + 2 * (fp32 + r.optimizer_bytes)) * r.cpu_optimizer_traffic \
        / hw.host_memory
    back = where(params_on_host, 0.0, shard_params * r.compute_weight_bytes / hw.h2d)
    return {"to_host": copies, "host_step": host_step, "to_device": back}


def dp_collectives(hw: Hardware, r, *, dp, cp, tp, zero, gpn, trainable, sharp, dp_shard, stage_layers,
                    modules_per_layer) -> dict:
    """The data-parallel group's collectives for one pass (`time.step_from_stages`): the groups, the
    calls per pass and each collective's seconds and latency of one call; one layout's (scalars)
    memoised (nothing here depends on the global batch), a dict the caller reads."""
    return scalar_call(_DP_COLLECTIVES, _dp_collectives_of, hw, r, dp, cp, tp, zero, gpn, trainable, sharp, dp_shard,
                       stage_layers, modules_per_layer)


_DP_COLLECTIVES = Memo(256)


def _dp_collectives_of(hw: Hardware, r, dp, cp, tp, zero, gpn, trainable, sharp, dp_shard, stage_layers,
                       modules_per_layer) -> dict:
    f = floats
    # ZeRO's collectives run over the shard group: all dp x cp ranks, or under hybrid sharding
    # the dp_shard x cp neighbouring ones; the replicas of each shard (dp / dp_shard of them,
    # dp_shard x cp x tp GPUs apart) then all-reduce their reduce-scattered gradients (FSDP2's
    # HSDP: an all-reduce of the reduce-scatter's output, on the same stream, after it)
    shard_group = (dp if dp_shard is None else f(dp_shard)) * cp
    replicas = dp * cp / shard_group
    wire_grad_bytes = trainable * r.reduce_bytes  # the gradients as the collectives carry them
    # ZeRO-3 / FSDP gathers the parameters for every micro-batch's forward and backward and
    # reduce-scatters its gradients, prefetching so each overlaps that micro-batch's compute;
    # a backward gather issued after the layer's gradients (BACKWARD_POST) waits in the open,
    # and without prefetch the reduce-scatter queued before it does too.
    # Each pass pays NCCL's latency per call (conventions.toml [efficiency.nccl_latency_us]):
    # ZeRO-3 / FSDP gathers and reduce-scatters unit by unit, one call per layer and one for the
    # root, each needed before (or freed after) its layer; a bucketed gradient reduction
    # (Megatron, DeepSpeed, DDP) is priced as one call per pass: counting Megatron-Core's
    # 40M-parameter buckets one call each would put its published H100 rows (DP 48 across
    # nodes) 2.4 points further off, 7.7% -> 10.1% mean, and its 16B row from +1% to -6%.
    per_unit = (zero >= 3) | r.per_unit_collectives
    units = f(stage_layers) + 1
    calls = where(per_unit, units, 1.0)
    # DeepSpeed's ZeRO-3 gathers submodule by submodule and reduce-scatters bucket by bucket
    # (conventions.toml [frameworks.deepspeed] zero3_module_fetches); FSDP a unit in one call
    module_fetches = (zero >= 3) & r.zero3_module_fetches
    gather_calls = calls * where(module_fetches, f(modules_per_layer), 1.0)
    bucketed = module_fetches & (r.reduce_bucket_elems > 0) & (not r.zero3_parameter_calls)
    scatter_calls = where(bucketed, maximum(trainable / max(r.reduce_bucket_elems, 1.0), 1.0),
                             where(module_fetches & r.zero3_parameter_calls, gather_calls, calls))
    # each call at the algorithm and protocol NCCL picks for its size (comm.nccl_call)
    gather, _, _, gather_lat = collective_terms(hw, comm.ALL_GATHER, trainable * r.compute_weight_bytes,
                                                shard_group, tp, gpn, calls=gather_calls)
    # (a group of one costs nothing: skipped outright where no layout has replicas)
    replica_ar = collective(hw, comm.ALL_REDUCE, wire_grad_bytes / shard_group, replicas, tp * shard_group, gpn,
                            sharp, calls=calls) if any_(replicas > 1) else 0.0
    scatter, _, _, scatter_lat = collective_terms(hw, comm.REDUCE_SCATTER, wire_grad_bytes, shard_group, tp, gpn,
                                                  calls=scatter_calls)
    scatter = scatter + replica_ar
    # plain data parallelism all-reduces the gradients, bucket by bucket
    ar, _, _, ar_lat = collective_terms(hw, comm.ALL_REDUCE, wire_grad_bytes, dp * cp, tp, gpn, sharp, calls=calls)
    return {"shard_group": shard_group, "replicas": replicas, "per_unit": per_unit, "units": units, "calls": calls,
            "gather_calls": gather_calls, "scatter_calls": scatter_calls, "gather": gather, "gather_lat": gather_lat,
            "replica_ar": replica_ar, "scatter": scatter, "scatter_lat": scatter_lat, "ar": ar, "ar_lat": ar_lat}


def dp_exposed(hw: Hardware, r, c: dict, *, pp, zero, m, stage_compute, recompute, backward_prefetch,
                overlap_dp, offload_params, trainable, dp_group) -> dict:
    """What the data-parallel collectives `c` (`dp_collectives`), the framework's passes over
    gradients and gathered parameters and the parameters' fetches from the host add to a step
    (`time.step_from_stages`), with how often each runs."""
    f = floats
    gather, scatter = c["gather"], c["scatter"]
    # the terms the micro-batches per step do not change (`_dp_overlaps`; one plan's memoised)
    pipelined_fsdp, unit_by_unit, backward_gathers, regathered, z3_one, backward, scatter_hidden, gather_hidden, \
        ar_hidden, grad_passes, shard = scalar_call(
            _OVERLAPS, _dp_overlaps, hw, r, gather, scatter, c["ar"], c["units"], c["per_unit"], c["shard_group"], pp,
            zero, stage_compute, f(recompute), f(backward_prefetch), overlap_dp, trainable)
    z3 = m * z3_one
    # How often the gradients are reduced, decided once for the collectives and the framework's
    # passes: FSDP (unit by unit, or NO_SHARD's all-reduce) and ZeRO-2, which keeps only its
    # partition of the gradients (DeepSpeed's stage_1_and_2.py reduces when "partition_gradients
    # or is_gradient_accumulation_boundary"), in every micro-batch's backward; ZeRO-1, Megatron's
    # distributed optimizer, DDP and pipelined FSDP once a step, in the last backward.
    reductions = where(pipelined_fsdp, 1.0, where(c["per_unit"] | (zero == 2), m, 1.0))
    gathers = where(unit_by_unit, where(backward_gathers, 2, 1) * m, 1.0)  # with ZeRO-1 and up
    # a sharded optimizer reduce-scatters the gradients behind each reducing backward and
    # all-gathers the parameters during the next step's first forward (--overlap-grad-reduce,
    # --overlap-param-gather); plain data parallelism all-reduces them
    z1 = where(overlap_dp, reductions * scatter_hidden + gather_hidden, reductions * scatter + gather)
    z0 = reductions * where(overlap_dp, ar_hidden, c["ar"])
    # The framework's own passes over the local gradients and the gathered parameters outside
    # the collectives (conventions.toml [frameworks] grad_reduce_passes, gather_copy_passes),
    # memory-bound work on the compute stream, at every reduction and gather.
    bookkeeping = where(dp_group > 1, trainable * (reductions * grad_passes * r.reduce_bytes
                                                      + where(unit_by_unit | pipelined_fsdp, gathers, 0.0)
                                                      * r.gather_copy_passes * r.compute_weight_bytes)
                           / hw.hbm, 0.0)
    # ZeRO-Infinity's parameter offload: every gather starts from the rank's shard on the host,
    # fetched over PCIe ahead of it (prefetched beside the compute like the gather itself)
    fetches = 0.0
    if any_(offload_params):
        fetch = trainable / shard * r.compute_weight_bytes / hw.h2d
        fetches = where(f(offload_params) > 0, gathers, 0.0) * where(
            overlap_dp, overlapped(fetch, stage_compute / 2, hw.overlap_slowdown), fetch)
    dp_exposed = where(unit_by_unit, z3, where(zero >= 1, z1, z0)) + bookkeeping + fetches
    return {"dp_exposed": dp_exposed, "bookkeeping": bookkeeping, "fetches": fetches, "reductions": reductions,
            "gathers": gathers, "regathered": regathered, "backward": backward, "shard": shard}


def _dp_overlaps(hw: Hardware, r, gather, scatter, ar, units, per_unit, shard_group, pp, zero, stage_compute, recompute,
                 backward_prefetch, overlap_dp, trainable) -> tuple:
    """`dp_exposed`'s terms of one micro-batch (none depends on the micro-batches per step): whether
    ZeRO-2/3 runs as pipelined FSDP, unit by unit, with backward gathers; the share gathered again
    for a recomputed forward; ZeRO-3's exposed seconds per micro-batch; the backward's seconds;
    the reduce-scatter, all-gather and all-reduce as each adds beside the compute it overlaps;
    the framework's passes over the gradients; and the ranks ZeRO shards over."""
    # Pipelined FSDP gathers each unit once a step, for the first forward, and reduce-scatters
    # it once, after the last backward (Recipe.keeps_stage_gathered): ZeRO-1's timing, unit by
    # unit. Otherwise FSDP's SHARD_GRAD_OP (ZeRO-2 unit by unit) gathers once a micro-batch, for
    # the forward, and keeps the parameters through the backward: no backward gather to wait for.
    pipelined_fsdp = r.keeps_stage_gathered(pp, zero)
    unit_by_unit = ((zero >= 3) | ((zero == 2) & per_unit)) & ~pipelined_fsdp
    backward_gathers = zero >= 3
    regathered = recompute_regathered(r, recompute, zero, trainable / units)
    z3_one = zero3_exposed(gather / units, scatter / units, units, stage_compute, recompute, regathered,
                           backward_gathers, backward_prefetch, overlap_dp, hw.overlap_slowdown,
                           gathers_overlap=r.zero3_gathers_overlap)
    backward = stage_compute * 2 / 3
    return (pipelined_fsdp, unit_by_unit, backward_gathers, regathered, z3_one, backward,
            overlapped(scatter, backward, hw.overlap_slowdown),
            overlapped(gather, stage_compute / 3, hw.overlap_slowdown),
            overlapped(ar, backward, hw.overlap_slowdown),
            where(zero >= 3, r.grad_reduce_passes_zero3, r.grad_reduce_passes), where(zero >= 1, shard_group, 1.0))


def optimizer_time(hw: Hardware, r, *, shard_params, reductions, backward, overlap_dp, offload_optimizer,
                    offload_params, ranks_per_host) -> tuple:
    """Seconds of one optimizer step over this rank's `shard_params` parameters, and the parts of
    an offloaded one (`offloaded_optimizer`; zero on the GPU)."""
    f = floats
    # One optimizer step over this rank's shard. A fused kernel reads the gradient, reads and
    # writes the master copy (the fp32 parameters themselves where there is none) and the
    # state, and writes the 16-bit working weights where there is a master copy: 28 bytes per
    # parameter for fp32 AdamW. Foreach and for-loop steps move `optimizer_traffic` times that.
    # Gradient-norm clipping runs before it over the same gradients (`grad_clip_passes`).
    updated = r.master_bytes if r.master_bytes > 0 else r.weight_bytes
    working = r.weight_bytes if r.master_bytes > 0 else 0.0
    opt_bytes = shard_params * ((r.grad_bytes + 2 * (updated + r.optimizer_bytes) + working) * r.optimizer_traffic
                                + r.grad_clip_passes * r.grad_bytes)
    on_host = {"to_host": 0.0, "host_step": 0.0, "to_device": 0.0}
    optimizer = opt_bytes / hw.hbm
    if any_(offload_optimizer):
        on_host = offloaded_optimizer(hw, r, shard_params=shard_params, reductions=reductions,
                                      backward=backward, overlap_dp=overlap_dp,
                                      ranks_per_host=ranks_per_host, params_on_host=f(offload_params) > 0)
        optimizer = where(f(offload_optimizer) > 0, sum(on_host.values()), optimizer)
    return optimizer, on_host
