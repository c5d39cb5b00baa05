"""ZeRO-2 as DeepSpeed and Megatron-LM run it, emulated in plain PyTorch over gloo (neither
package is installed): DDP-style replicated 16-bit parameters, the backward producing full
gradients, which are then reduce-scattered so that each rank updates only its partition, and a
sharded optimizer (fp32 master partition plus AdamW state on it). Measured per rank at the end
of the step and at the gradients' peak.

* deepspeed (deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer): gradients are
  reduced bucket by bucket (`reduce_ipg_grads` -> `average_tensor`, reduce_bucket_size 5e8
  elements by default, so a model this small is one bucket: the whole 16-bit gradient exists
  once the backward ends); each rank copies its partition into `grads_in_partition`, a
  contiguous partition-sized buffer in the gradients' dtype, and the parameters' full `.grad`
  are freed (`free_grad_in_param_list`). `step` casts the flattened partition to fp32 as
  `single_partition_of_fp32_groups[i].grad` (a transient fp32 partition), updates the fp32
  partition and all-gathers the 16-bit parameters (`all_gather_dp_groups`).
* megatron (megatron/core/distributed/param_and_grad_buffer.py with
  megatron/core/optimizer/distrib_optimizer.py): every parameter's `main_grad` is a view into
  one contiguous gradient buffer (`grad_data`, fp32 under bf16: --accumulate-allreduce-grads-
  in-fp32, which megatron/training/arguments.py sets for bf16); `start_grad_sync`
  reduce-scatters each bucket into this rank's shard of the same buffer
  (`reduce_scatter_tensor(local_data_view, bucket.grad_data)`, `shard_buffer`), and the buffer
  is never freed: it is reused (zeroed) by the next step. The optimizer's fp32 main parameters
  are this rank's shard, and their `.grad` is a view of the buffer's shard
  (`_copy_model_grads_to_main_grads`), so nothing more is allocated.

Partitions are even splits of the flattened parameters (padded to a multiple of the ranks, as
both frameworks align their flat groups); the reduce-scatter is gloo's.
"""

from __future__ import annotations

from ..errors import PlanError
from ..plan import Layout
from ..specs.model import ModelSpec
from .distributed import finish_rank, join_gloo, run_ranks

FRAMEWORKS = ("deepspeed", "megatron")


def _flat_partition(numel: int, world: int) -> int:
    return -(-numel // world)


def _worker(rank: int, world: int, port: int, payload: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from ..plan import Plan
    from .measure import SavedTensors, tensor_bytes
    from .step import build_model, low_dtype

    join_gloo(rank, world, port)
    try:
        spec, plan = ModelSpec(**payload["spec"]), Plan(**payload["plan"])
        fw = plan.framework
        model = build_model(spec, plan, "cpu").to(low_dtype(plan))  # 16-bit replicated parameters
        params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in params)
        part = _flat_partition(numel, world)
        lo, hi = rank * part, min((rank + 1) * part, numel)
        with torch.no_grad():
            flat16 = torch.cat([p.reshape(-1) for p in params])
            master = flat16[lo:hi].float().clone().requires_grad_()  # fp32 master partition
        del flat16
        opt = torch.optim.AdamW([master], lr=1e-4)
        buffer = None
        if fw == "megatron":  # one contiguous fp32 gradient buffer, main_grad views into it
            buffer = torch.zeros(part * world, dtype=torch.float32)
            start = 0
            for p in params:
                p.main_grad = buffer[start:start + p.numel()].view_as(p)
                start += p.numel()

                def hook(p):
                    p.main_grad.add_(p.grad)
                    p.grad = None
                p.register_post_accumulate_grad_hook(hook)
        g = torch.Generator().manual_seed(1 + rank)
        ids = torch.randint(0, spec.vocab, (payload["mbs"], payload["seq_len"]), generator=g)
        rec = SavedTensors(model)
        with rec:
            loss = model(ids, ids)
        regions, saved = rec.by_region(), rec.bytes_alive()
        loss.backward()
        if fw == "megatron":
            full_grads = tensor_bytes([buffer])
            shard = buffer[rank * part:(rank + 1) * part]
            dist.reduce_scatter_single(shard, buffer)  # into this rank's view of the same buffer
            shard /= world
            kept = tensor_bytes([buffer])  # the buffer stays whole
            grad32 = shard[:hi - lo]  # a view: the main parameters' .grad costs nothing
            step_peak = kept
        else:
            full_grads = tensor_bytes(p.grad for p in params)
            flat = torch.zeros(part * world, dtype=params[0].grad.dtype)
            torch.cat([p.grad.reshape(-1) for p in params], out=flat[:numel])
            for p in params:
                p.grad = None  # free_grad_in_param_list
            grads_in_partition = torch.empty(part, dtype=flat.dtype)
            dist.reduce_scatter_single(grads_in_partition, flat)
            del flat
            grads_in_partition /= world
            kept = tensor_bytes([grads_in_partition])
            grad32 = grads_in_partition[:hi - lo].float()  # single_partition_of_fp32_groups[i].grad
            step_peak = kept + tensor_bytes([grad32])
        master.grad = grad32
        opt.step()
        master.grad = None
        del grad32
        with torch.no_grad():  # all-gather the updated 16-bit partitions into the parameters
            gathered = torch.zeros(part * world, dtype=params[0].dtype)
            local = torch.zeros(part, dtype=params[0].dtype)
            local[:hi - lo] = master.detach()
            dist.all_gather_single(gathered, local)
            start = 0
            for p in params:
                p.copy_(gathered[start:start + p.numel()].view_as(p))
                start += p.numel()
        from .step import optimizer_state_bytes

        result = {"params_bytes": tensor_bytes(params), "grads_bytes": kept,
                  "optimizer_bytes": optimizer_state_bytes(opt) + tensor_bytes([master]),
                  "activations_bytes": saved, "regions": regions, "grads_peak_bytes": max(full_grads, step_peak),
                  "grads_full_bytes": full_grads, "grads_step_bytes": step_peak}
        if buffer is not None:
            buffer.zero_()

        def step():
            out = model(ids, ids)
            out.backward()
            return out
        finish_rank(result, step, rank, out_dir)
    finally:
        dist.destroy_process_group()


def check(layout: Layout) -> None:
    plan = layout.plan
    if plan.framework not in FRAMEWORKS:
        raise PlanError("framework", f"validate's DeepSpeed/Megatron ZeRO-2 emulation runs {', '.join(FRAMEWORKS)}; "
                        "--framework fsdp runs FSDP2's SHARD_GRAD_OP")
    if plan.precision not in ("bf16", "fp16") or not plan.master_weights:
        raise PlanError("precision", "validate's ZeRO-2 emulation trains 16-bit parameters with fp32 master copies: "
                        "--precision bf16 or fp16")
    if plan.optimizer != "adamw":
        raise PlanError("optimizer", "validate's ZeRO-2 emulation steps AdamW")
    if layout.tp > 1 or layout.pp > 1 or layout.cp > 1 or layout.ep > 1 or layout.dp_shard < layout.dp:
        raise PlanError("zero", "validate's ZeRO-2 emulation runs data parallelism alone (tp = pp = cp = ep = 1)")
    if plan.recompute != "none" or plan.finetune != "full" or plan.dropout > 0:
        raise PlanError("zero", "validate's ZeRO-2 emulation covers full training without recompute or dropout")
    from .step import check_state_dtype

    check_state_dtype(plan)


def run_zero2(layout: Layout, spec: ModelSpec, name: str) -> list:
    """ZeRO-2 over dp local processes; each rank compared with the planner's per-GPU prediction."""

    from .run import TERMS, Case, predict

    check(layout)
    world = layout.gpus
    payload = {"spec": spec.model_dump(), "plan": layout.plan.model_dump(), "mbs": layout.mbs,
               "seq_len": layout.seq_len}
    results = run_ranks(_worker, world, payload)
    predicted = predict(layout, "cpu")
    cases = []
    for r, measured in enumerate(results):
        case = Case(f"{name} — rank {r}", {k: predicted[k] for k in TERMS}, {k: measured[k] for k in TERMS},
                    extra={"grads_peak_bytes": measured["grads_peak_bytes"],
                           "grads_full_bytes": measured["grads_full_bytes"],
                           "grads_step_bytes": measured["grads_step_bytes"],
                           "activation_regions": {"measured": measured["regions"], "predicted": predicted["parts"]}})
        case.notes.append(f"gradients at their peak {measured['grads_peak_bytes'] / 2**20:.3f} MiB (after the "
                          f"backward {measured['grads_full_bytes'] / 2**20:.3f}, in the optimizer step "
                          f"{measured['grads_step_bytes'] / 2**20:.3f}); the prediction is the gradients kept")
        cases.append(case.finish())
    return cases
