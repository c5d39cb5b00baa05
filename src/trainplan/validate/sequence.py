"""Sequence parallelism measured per rank: Megatron-style tensor parallelism whose norms,
dropouts and residual stream are split along the sequence (Korthikanti et al. 2023 §4.2.2),
written with DTensor as torchtitan writes it (torch.distributed.tensor.parallel):

* the embedding is row-parallel with a sequence-sharded output
  (`RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))`);
* every norm is `SequenceParallel` (its input, output and saved tensors are the rank's
  s/t tokens);
* the attention and MLP blocks gather their sequence-sharded input once
  (`PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`), their input
  projections are `ColwiseParallel`, and their output projections
  `RowwiseParallel(output_layouts=Shard(1))` reduce-scatter back to the sequence shards;
* the output head is column-parallel over the vocabulary reading the sequence-sharded final
  norm (`ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))`), with
  `loss_parallel` cross-entropy.

What autograd keeps: DTensor runs each op on local shards and each op saves what it saves on
one process, so the norms keep their s/t-token shards, and the linears that read a gathered
input keep the gathered (full-sequence) tensor: DTensor has no counterpart of Megatron's
re-gather in backward (Megatron's `LinearWithGradAccumulationAndAsyncCommunication` saves the
sequence-sharded input and all-gathers it again for the weight gradient). The planner's
`torch` and `fsdp` frameworks price that (conventions.toml, `sp_saves_gathered_input`).

Context parallelism (`torch.distributed.tensor.experimental.context_parallel`) is checked
here too (`check_context_parallel`): on the CPU its ring attention cannot run (see there).
"""

from __future__ import annotations

from ..errors import PlanError
from ..plan import Layout
from ..specs.model import ModelSpec


def apply_sp(model, spec: ModelSpec, mesh, tp: int):
    """Tensor and sequence parallelism with DTensor (module docstring); returns the
    loss-parallel context."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    parallelize_module(model, mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    gather = dict(input_layouts=(Shard(1), None, None, None), desired_input_layouts=(Replicate(), None, None, None))
    for blk in model.blocks:
        attn = blk.attn
        names = ["qkv"] if attn.fused else ["q", "k", "v"]
        layer = {"norm1": SequenceParallel(), "norm2": SequenceParallel(),
                 "attn": PrepareModuleInput(**gather),
                 "attn.o": RowwiseParallel(output_layouts=Shard(1)),
                 "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                 "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1))}
        layer.update({f"attn.{n}": ColwiseParallel() for n in names})
        if blk.mlp.swiglu:
            layer["mlp.gate"] = ColwiseParallel()
        parallelize_module(blk, mesh, layer)
        attn.heads, attn.kv_heads = spec.heads // tp, spec.n_kv_heads // tp
    if spec.tied_embeddings:  # parallelizing both modules untied them; both are Shard(0)
        model.head.weight = model.embed.weight
    return loss_parallel


def check_sp(layout: Layout) -> None:
    """What the sequence-parallel run covers, checked before any process starts."""
    plan, spec = layout.plan, layout.model
    if spec.is_moe:
        raise PlanError("sp", "validate's sequence-parallel run covers dense models; MoE experts under "
                        "sequence parallelism are predicted only")
    if spec.parallel_residual:
        raise PlanError("sp", "validate's sequence-parallel run covers sequential residual blocks; "
                        "a parallel residual (GPT-NeoX) under sequence parallelism is predicted only")
    if spec.position == "learned":
        raise PlanError("sp", "validate's sequence-parallel run covers rotary positions; learned "
                        "position embeddings under sequence parallelism are predicted only")
    if plan.dropout > 0:
        raise PlanError("sp", "validate's sequence-parallel run is measured without dropout (--dropout 0)")
    if layout.seq_len % layout.tp:
        raise PlanError("sp", f"the sequence ({layout.seq_len}) must divide by tp ({layout.tp}) "
                        "to split it along the sequence")


def local_flops(fn) -> tuple[int, object]:
    """FLOPs of `fn()` on this rank's shards: `FlopCounterMode`'s formulas applied to the plain
    tensors DTensor computes on. (`FlopCounterMode` itself sees each DTensor op at its global
    shapes.) Ops with a DTensor argument are handed on to DTensor (NotImplemented), whose local
    ops come back through this mode; the FakeTensor ops DTensor's sharding propagation runs
    are not counted."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    from .measure import _cpu_flash_mapping, _NoModules

    counter = FlopCounterMode(display=False, custom_mapping=_cpu_flash_mapping())
    counter.mod_tracker = _NoModules()

    class Local(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            if any(isinstance(a, DTensor) for a in leaves):
                return NotImplemented
            out = func(*args, **kwargs)
            if not any(isinstance(a, FakeTensor) for a in leaves):
                counter._count_flops(func._overloadpacket, out, args, kwargs)
            return out

    with Local():
        out = fn()
    return counter.get_total_flops(), out
