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

Context parallelism is measured in `context_parallel.py`; `probe_context_parallel_cpu` here
records what torch's `context_parallel` does on the CPU as torch ships it (its op table lists
the CUDA SDPA kernels only).
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


CP_BACKENDS = ("FLASH_ATTENTION", "MATH", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def _cp_probe_worker(rank: int, port: int, out_dir: str) -> None:
    import json
    import os
    from pathlib import Path

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        mesh = init_device_mesh("cpu", (2,))
        results = {}
        for name in CP_BACKENDS:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
            try:
                with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
                    with sdpa_kernel(getattr(SDPBackend, name)):
                        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).sum().backward()
                results[name] = "ran"
            except Exception as e:  # noqa: BLE001 (what torch raises is the finding)
                results[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def probe_context_parallel_cpu() -> dict[str, str]:
    """Try torch's `context_parallel` ring attention on two gloo ranks on the CPU, causal SDPA
    forward and backward under each SDPA backend; returns rank 0's outcome per backend ("ran",
    or the exception torch raised)."""
    import json
    import tempfile
    from pathlib import Path

    import torch.multiprocessing as mp

    from .distributed import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_cp_probe_worker, args=(free_port(), out), nprocs=2, join=True)
        return json.loads(Path(out, "rank0.json").read_text())
