"""Sharded layouts run for real: local processes joined by `torch.distributed` (gloo on the
CPU), each measuring its own bytes.

* ZeRO-3 / FSDP: FSDP2 `fully_shard` on every block and the root, with
  `MixedPrecisionPolicy(param_dtype=16-bit, reduce_dtype=fp32)` for mixed precision (the plan's
  reduce_dtype when it names one); ZeRO-2 under `--framework fsdp` with
  `reshard_after_forward=False` (SHARD_GRAD_OP), whose parameters are measured as their shards
  plus the copies gathered for the forward and kept until the backward; hybrid sharding
  (`--dp-shard`) over a (replicate, shard) mesh.
* ZeRO-1: `DistributedDataParallel` with `ZeroRedundancyOptimizer` (optimizer state sharded).
* Tensor parallelism: DTensor `parallelize_module`, column-parallel Q/K/V and MLP input
  projections, row-parallel output projections, a vocabulary-parallel embedding and output
  head with `loss_parallel` cross-entropy.

Each rank returns parameters, gradients, optimizer state and saved activations (bytes of its
local shards) and its FLOPs; the prediction is the plan's per-GPU figure for that rank.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

from ..errors import PlanError
from ..plan import Layout
from ..specs.model import ModelSpec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_gloo(rank: int, world: int, port: int) -> None:
    """A worker joins the local gloo group on 127.0.0.1, one thread a rank."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def finish_rank(result: dict, step, rank: int, out_dir: str) -> None:
    """A worker's last act: the FLOPs of one more `step()`, its measurements written to
    out_dir/rank{rank}.json, then a barrier so no rank tears gloo down early."""
    import torch.distributed as dist

    from .measure import counted_flops

    result["flops"], _ = counted_flops(step)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


def run_ranks(worker, world: int, payload: dict) -> list[dict]:
    """`worker(rank, world, port, payload, out_dir)` on `world` local processes; each writes
    out_dir/rank{r}.json, returned in rank order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        try:
            mp.spawn(worker, args=(world, free_port(), payload, out), nprocs=world, join=True)
        except mp.ProcessExitedException:
            # A worker killed by a signal after every rank wrote its measurement died tearing
            # gloo down (a C++ thread aborts at exit now and then); the measurements stand.
            if not all(Path(out, f"rank{r}.json").is_file() for r in range(world)):
                raise
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def _worker(rank: int, world: int, port: int, payload: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from ..plan import Plan, resolve
    from .measure import SavedTensors, counted_flops, tensor_bytes
    from .step import build_model, low_dtype, make_optimizer

    join_gloo(rank, world, port)
    try:
        spec = ModelSpec(**payload["spec"])
        plan = Plan(**payload["plan"])
        layout = resolve(plan, spec)
        device = "cpu"
        model = build_model(spec, plan, device)
        tp, mixed = layout.tp, plan.precision != "fp32"
        pure16 = mixed and not plan.master_weights
        if pure16:  # pure 16-bit training: the model itself in bf16/fp16
            model.to(low_dtype(plan))
        loss_ctx = None
        from torch.distributed.device_mesh import init_device_mesh

        if layout.dp_shard < layout.dp:  # hybrid sharding: FSDP2 over a (replicate, shard) mesh
            mesh = init_device_mesh(device, (layout.dp // layout.dp_shard, layout.dp_shard, tp),
                                    mesh_dim_names=("replicate", "shard", "tp"))
            dp_mesh = mesh["replicate", "shard"]
        else:
            mesh = init_device_mesh(device, (layout.dp, tp), mesh_dim_names=("dp", "tp"))
            dp_mesh = mesh["dp"]
        if tp > 1 and plan.sp:
            from .sequence import apply_sp

            loss_ctx = apply_sp(model, spec, mesh["tp"], tp)
        elif tp > 1:
            loss_ctx = _apply_tp(model, spec, mesh["tp"], tp)
        opt_params = None
        if layout.zero >= 3 or plan.framework == "fsdp":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            reduce = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.reduce_dtype, torch.float32)
            mp = MixedPrecisionPolicy(param_dtype=low_dtype(plan), reduce_dtype=reduce) if mixed \
                else MixedPrecisionPolicy(reduce_dtype=reduce if plan.reduce_dtype else None)
            reshard = layout.zero >= 3  # SHARD_GRAD_OP keeps each block gathered until its backward
            for blk in model.blocks:
                fully_shard(blk, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
            fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
            opt = make_optimizer(plan.optimizer, model.parameters())
        elif layout.zero >= 1 and layout.dp > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model)
            cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[plan.optimizer]
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=1e-4)
        else:
            if layout.dp > 1:
                from torch.nn.parallel import DistributedDataParallel as DDP

                model = DDP(model)
            opt_params = list(model.parameters())
            opt = make_optimizer(plan.optimizer, opt_params)
        core = model.module if hasattr(model, "module") else model
        g = torch.Generator().manual_seed(1 + rank // tp)  # same batch within a TP group
        ids = torch.randint(0, spec.vocab, (layout.mbs, layout.seq_len), generator=g)
        autocast = mixed and plan.framework == "torch" and layout.zero < 3 and not pure16

        def forward():
            import contextlib

            ac = torch.autocast("cpu", dtype=low_dtype(plan)) if autocast else contextlib.nullcontext()
            lc = loss_ctx() if loss_ctx else contextlib.nullcontext()
            with ac, lc:
                return model(ids, ids)

        from .measure import _key, _local

        sharded = {_key(_local(p).untyped_storage()) for p in core.parameters()}
        rec = SavedTensors(core)
        with rec:
            loss = forward()
        # FSDP2 leaves the root's gathered parameters in place after the forward (plain
        # tensors, or DTensors over the TP mesh), and under SHARD_GRAD_OP every block's: those
        # unsharded copies are the ZeRO-3 gather buffer, or ZeRO-2's gathered parameters, not
        # activations.
        after_forward = {_key(_local(p).untyped_storage()): _local(p).untyped_storage() for p in core.parameters()}
        gathered = set(after_forward) - sharded
        gathered_bytes = sum(after_forward[k].nbytes() for k in gathered)
        regions: dict[str, int] = {}
        for ptr, (st, region) in rec.storages.items():
            if ptr not in gathered:
                regions[region] = regions.get(region, 0) + st.nbytes()
        saved = sum(regions.values())
        import contextlib

        with (loss_ctx() if loss_ctx else contextlib.nullcontext()):
            loss.backward()
        grads = tensor_bytes(p.grad for p in core.parameters())
        opt.step()
        if hasattr(opt, "optim"):  # ZeroRedundancyOptimizer: this rank's partition
            state = opt.optim.state
        else:
            state = opt.state
        opt_bytes = tensor_bytes(v for s in state.values() for v in s.values() if isinstance(v, torch.Tensor))
        params = tensor_bytes(core.parameters())
        if layout.zero == 2:
            params += gathered_bytes
        opt.zero_grad(set_to_none=True)
        flops = None
        if tp == 1:
            # (FlopCounterMode counts DTensor matmuls at their global shapes and cannot
            # dispatch loss_parallel's backward, so per-rank FLOPs under TP are not measured.)
            def step():
                out = forward()
                out.backward()
                return out
            flops, _ = counted_flops(step)
        elif plan.sp:  # this rank's shards (sequence.local_flops)
            from .sequence import local_flops

            def step():
                out = forward()
                import contextlib

                with (loss_ctx() if loss_ctx else contextlib.nullcontext()):
                    out.backward()
                return out
            flops, _ = local_flops(step)
        result = {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": opt_bytes,
                  "activations_bytes": saved, "flops": flops, "regions": regions}
        if plan.sp:  # what the first layer keeps, tensor by tensor (sequence shards or gathered)
            result["saved_layer0"] = [list(rec.packed_sizes[p]) for p, (_, region) in rec.storages.items()
                                      if region == "layer 0"]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # no rank tears down gloo while another still has work in flight
    finally:
        dist.destroy_process_group()


def _apply_tp(model, spec: ModelSpec, mesh, tp: int, vocab_parallel_loss: bool = True):
    """Megatron-style tensor parallelism with DTensor; returns the loss-parallel context
    (None when the logits are gathered for an ordinary cross-entropy)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) if vocab_parallel_loss
        else ColwiseParallel(output_layouts=Replicate()),
    }
    parallelize_module(model, mesh, plan)
    for blk in model.blocks:
        attn = blk.attn
        names = ["qkv"] if attn.fused else ["q", "k", "v"]
        layer = {f"attn.{n}": ColwiseParallel() for n in names}
        layer["attn.o"] = RowwiseParallel()
        if hasattr(blk.mlp, "experts"):
            for e in range(len(blk.mlp.experts)):
                layer[f"mlp.experts.{e}.up"] = ColwiseParallel()
                layer[f"mlp.experts.{e}.down"] = RowwiseParallel()
                if blk.mlp.experts[e].swiglu:
                    layer[f"mlp.experts.{e}.gate"] = ColwiseParallel()
            if blk.mlp.shared is not None:
                layer["mlp.shared.up"] = ColwiseParallel()
                layer["mlp.shared.down"] = RowwiseParallel()
                if blk.mlp.shared.swiglu:
                    layer["mlp.shared.gate"] = ColwiseParallel()
        else:
            layer["mlp.up"] = ColwiseParallel()
            layer["mlp.down"] = RowwiseParallel()
            if blk.mlp.swiglu:
                layer["mlp.gate"] = ColwiseParallel()
        parallelize_module(blk, mesh, layer)
        attn.heads, attn.kv_heads = spec.heads // tp, spec.n_kv_heads // tp
    if spec.tied_embeddings:  # parallelizing both modules untied them; both are Shard(0)
        model.head.weight = model.embed.weight
    return loss_parallel if vocab_parallel_loss else None


def run_distributed(layout: Layout, spec: ModelSpec, device: str, name: str) -> list:
    """Run the layout in tp x dp local processes and compare each rank with the prediction."""

    from .run import TERMS, Case, predict

    if device != "cpu":
        raise PlanError("device", "sharded validation runs on the CPU (gloo) here")
    plan = layout.plan
    if spec.n_kv_heads % layout.tp or spec.heads % layout.tp:  # checked here, before any process starts
        raise PlanError("tp", f"validate's tensor-parallel run splits the heads and KV heads: tp ({layout.tp}) must "
                        f"divide both ({spec.heads} and {spec.n_kv_heads} in the model it runs)")
    if layout.zero == 2 and plan.framework != "fsdp":
        raise PlanError("zero", "validate runs ZeRO-2 as FSDP2's SHARD_GRAD_OP or as DeepSpeed's and Megatron's "
                        "reduce-scattered gradients: use --framework fsdp, deepspeed or megatron")
    if layout.dp_shard < layout.dp and (layout.zero < 2 or plan.framework != "fsdp"):
        raise PlanError("dp_shard", "validate runs hybrid sharding as FSDP2 over a (replicate, shard) mesh: "
                        "--zero 2 or 3 --framework fsdp")
    if layout.zero == 0 and layout.dp > 1 and plan.framework == "fsdp":
        raise PlanError("zero", "validate runs FSDP2 sharded over data parallelism (--zero 2 or 3); "
                        "a replicated run is DDP: --framework torch")
    if layout.zero >= 1 and layout.zero < 3 and plan.optimizer not in ("adamw", "adam", "sgd"):
        raise PlanError("optimizer", "ZeroRedundancyOptimizer runs adamw, adam or sgd here")
    if layout.tp > 1 and layout.dp > 1 and layout.zero < 2:
        raise PlanError("zero", "validate combines tensor and data parallelism through FSDP2: "
                        "use --zero 2 or 3 --framework fsdp")
    if plan.fused_loss and layout.tp > 1:
        raise PlanError("fused_loss", "validate measures tensor parallelism with PyTorch's vocab-parallel "
                        "cross-entropy (loss_parallel); measure a fused loss with tp = 1")
    if plan.recompute == "full" and layout.tp > 1:
        raise PlanError("recompute", "validate measures full recompute with tp = 1 (the re-run "
                        "layer's working set is measured on an unsharded twin)")
    if plan.sp:
        from .sequence import check_sp

        check_sp(layout)
    from .step import check_state_dtype

    check_state_dtype(plan)
    if layout.zero == 1 and plan.precision != "fp32" and plan.framework != "torch":
        raise PlanError("framework", "ZeRO-1 validation uses PyTorch DDP + autocast: --framework torch")
    if (layout.zero >= 3 or plan.framework == "fsdp") and plan.framework not in ("fsdp",) and plan.precision != "fp32":
        raise PlanError("framework", "ZeRO-3 validation runs FSDP2: use --framework fsdp")
    world = layout.gpus
    payload = {"spec": spec.model_dump(), "plan": plan.model_dump()}
    results = run_ranks(_worker, world, payload)
    predicted = predict(layout, device)
    working_set = None
    if plan.recompute == "full":
        # One layer re-run in backward, per rank: the same shapes as on one process (tp = 1).
        from .step import build_model, low_dtype, recompute_working_set

        twin = build_model(spec, plan, device)
        mixed = plan.precision != "fp32"
        if mixed and plan.framework != "torch":
            twin.to(low_dtype(plan))
        working_set = recompute_working_set(twin, layout, device, mixed and plan.framework == "torch")
    sharded_inputs = None
    if plan.sp:
        from dataclasses import replace

        from ..estimate.recipe import recipe

        sharded_inputs = predict(layout, device, r=replace(recipe(plan), sp_gathers_saved_inputs=False))[
            "activations_bytes"]
    cases = []
    for r, measured in enumerate(results):
        if working_set is not None:
            measured["activations_bytes"] += working_set
        case = Case(f"{name} — rank {r}", {k: predicted[k] for k in TERMS}, {k: measured[k] for k in TERMS},
                    extra={"activation_regions": {"measured": measured["regions"],
                                                  "predicted": predicted["parts"]}})
        if measured["flops"] is None:
            case.notes.append("FLOPs not measured under tensor parallelism: FlopCounterMode counts "
                              "DTensor matmuls at their global shapes")
        if "saved_layer0" in measured:
            case.extra["saved_layer0"] = measured["saved_layer0"]
            case.extra["activations_sequence_sharded"] = sharded_inputs  # Megatron's rule, for comparison
        if layout.zero == 1:
            case.notes.append("ZeroRedundancyOptimizer assigns whole parameters to ranks, so "
                              "per-rank optimizer state deviates from the even split")
        cases.append(case.finish())
    return cases
