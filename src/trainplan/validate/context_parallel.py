"""Context parallelism measured per rank with torch's own ring attention on the CPU.

`torch.distributed.tensor.experimental.context_parallel` (PyTorch 2.13) shards the batch's
sequence over the CP ranks (`buffers`, load-balanced: 2·cp chunks, rank r holding chunks r and
2·cp - 1 - r, `_load_balancer.py`), wraps SDPA's q, k, v as DTensors sharded on the sequence
and hands the SDPA kernels to its ring attention (`_templated_ring_attention` and
`_templated_ring_attention_backward` in `_context_parallel/_attention.py`: K/V blocks passed
round the ring, partial outputs merged by their log-sum-exp). Its op table (`custom_ops`)
lists the CUDA kernels only (`_scaled_dot_product_flash_attention`, `_efficient_`, `_cudnn_`
and their backwards), so on the CPU SDPA's flash kernel
(`aten._scaled_dot_product_flash_attention_for_cpu`) reaches DTensor's sharding propagation,
which has no rule for it ("Operator aten._scaled_dot_product_flash_attention_for_cpu.default
does not have a sharding strategy registered").

`cpu_ring_attention()` adds the CPU flash kernel and its backward to that table, handing them
to the same two ring functions (they take the per-block kernel as an argument; the CPU kernel
returns (out, logsumexp) and its backward (dq, dk, dv), which is what they unpack). Nothing
else of torch's CP changes: its sequence sharding, load balancing, K/V rotation over the
process group (gloo here) and merging run as on GPUs. What autograd saves is then what it
saves under CP on GPUs: the attention node keeps the rank's q, k, v, output and log-sum-exp
(s/cp tokens; the ring's K/V blocks are exchanged again in backward, not saved), and every
other op runs on the rank's s/cp tokens.

The run: the plan's model scaled down (Llama-style, rotary positions, SDPA), `cp` local
processes over gloo, each measuring the bytes saved for backward, parameters, gradients
(all-reduced over the CP group, as a data-parallel group would) and AdamW state after a step,
and the FLOPs of its shards (`sequence.local_flops`), against the planner's per-GPU
prediction for the layout.
"""

from __future__ import annotations

from ..errors import PlanError
from ..plan import Layout
from ..specs.model import ModelSpec

SEQ_DIM = 2  # SDPA's (batch, heads, sequence, head dim)


def cpu_ring_attention() -> None:
    """Register the CPU flash SDPA kernel and its backward in torch's CP op table (module
    docstring); idempotent. Takes effect when `context_parallel` enables its dispatcher."""
    import torch
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    aten = torch.ops.aten

    def wrap(local, mesh):
        shape = list(local.shape)
        shape[SEQ_DIM] *= mesh.size()
        shape = torch.Size(shape)
        stride = torch.empty(shape, device="meta").stride()
        spec = DTensorSpec(mesh, (Shard(SEQ_DIM),), tensor_meta=TensorMeta(shape, stride, local.dtype))
        return DTensor(local, spec, requires_grad=False)

    def forward(op_call, args, kwargs):
        # _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p=0.0,
        # is_causal=False, *, attn_mask=None, scale=None) -> (output, logsumexp)
        names = ("query", "key", "value", "dropout_p", "is_causal")
        a = {"dropout_p": 0.0, "is_causal": False, **dict(zip(names, args, strict=False)), **kwargs}
        if a.get("attn_mask") is not None:
            raise NotImplementedError("context parallelism runs causal or unmasked attention, not attn_mask")
        mesh = a["query"].device_mesh
        out, lse = cp._templated_ring_attention(
            mesh.get_group(), SEQ_DIM, aten._scaled_dot_product_flash_attention_for_cpu.default,
            query=a["query"]._local_tensor, key=a["key"]._local_tensor, value=a["value"]._local_tensor,
            is_causal=a["is_causal"], dropout_p=a["dropout_p"], scale=a.get("scale"))
        return wrap(out, mesh), wrap(lse, mesh)

    def backward(op_call, args, kwargs):
        # _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
        # logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None) -> (dq, dk, dv)
        names = ("grad_out", "query", "key", "value", "out", "logsumexp", "dropout_p", "is_causal")
        a = {**dict(zip(names, args, strict=False)), **kwargs}
        mesh = a["query"].device_mesh
        local = {n: a[n]._local_tensor for n in names[:6]}
        grads = cp._templated_ring_attention_backward(
            mesh.get_group(), SEQ_DIM, aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad_out_name="grad_out", is_causal=a["is_causal"], dropout_p=a["dropout_p"], scale=a.get("scale"),
            **local)
        return tuple(wrap(g, mesh) for g in grads[:3])

    cp.custom_ops[aten._scaled_dot_product_flash_attention_for_cpu.default] = forward
    cp.custom_ops[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = backward


def check(layout: Layout) -> None:
    """What the CP run covers, checked before any process starts."""
    plan, spec = layout.plan, layout.model
    # (the sequence's 2·cp chunks for torch's load balancer are the planner's own rule, field cp)
    rules = (
        ("framework", plan.framework != "torch", "validate runs torch's context parallelism: --framework torch"),
        *((f, getattr(layout, f) > 1, f"validate runs context parallelism alone ({f} = 1)") for f in ("tp", "pp", "dp", "ep")),
        ("cp_comm", plan.cp_comm != "ring",
         "torch's context_parallel passes K/V round a ring; an all-gather of K/V before attention "
         "(--cp-comm allgather) is predicted only"),
        ("attention", plan.attention == "eager",
         "context parallelism shards SDPA; eager attention (--attention eager) is not sharded by it"),
        ("dropout", plan.dropout > 0, "validate runs context parallelism without dropout"),
        ("recompute", plan.recompute != "none", "validate runs context parallelism without recompute"),
        ("finetune", plan.finetune != "full", "validate runs context parallelism in full training"),
        ("zero", layout.zero > 0, "validate runs context parallelism without ZeRO"),
        ("model", spec.is_moe or spec.is_mla or spec.position != "rotary" or spec.parallel_residual,
         "validate's context-parallel run covers dense Llama-style models (rotary positions, "
         "sequential blocks, no MLA)"),
        ("precision", plan.precision not in ("fp32", "bf16"),
         "validate runs context parallelism in fp32 or under bf16 autocast"),
    )
    for field, bad, rule in rules:
        if bad:
            raise PlanError(field, rule)


def _shard_rope_tables(rank: int, cp: int, seq: int) -> None:
    """The model's RoPE tables for this rank's tokens: the whole sequence's tables cut as
    torch's load balancer cuts the sequence (2·cp chunks, rank r holding chunks r and
    2·cp - 1 - r), as torchtitan shards its freqs_cis buffer with the batch. Each forward makes
    them anew, s/cp rows, as the model makes its tables without CP."""
    import torch

    from . import models

    whole = models.rope_tables

    def tables(s, dim, device, dtype, base=10000.0):
        n = 2 * cp
        return tuple(torch.cat([t.chunk(n)[rank], t.chunk(n)[n - 1 - rank]])
                     for t in whole(seq, dim, device, dtype, base))

    models.rope_tables = tables


def _worker(rank: int, world: int, port: int, payload: dict, out_dir: str) -> None:
    import contextlib
    import json
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..plan import Plan, resolve
    from .distributed import join_gloo
    from .measure import SavedTensors, tensor_bytes
    from .sequence import local_flops
    from .step import build_model, low_dtype, make_optimizer, optimizer_state_bytes

    join_gloo(rank, world, port)
    try:
        spec, plan = ModelSpec(**payload["spec"]), Plan(**payload["plan"])
        layout = resolve(plan, spec)
        cpu_ring_attention()
        mesh = init_device_mesh("cpu", (world,))
        model = build_model(spec, plan, "cpu")
        params = list(model.parameters())
        opt = make_optimizer(plan.optimizer, params)
        g = torch.Generator().manual_seed(1)  # one batch, its sequence split over the ranks
        ids = torch.randint(0, spec.vocab, (layout.mbs, layout.seq_len), generator=g)
        targets = ids.clone()
        with torch.no_grad():
            unsharded_loss = float(model(ids, targets))
        _shard_rope_tables(rank, world, layout.seq_len)

        def sharded(fn):
            """fn() with the batch's sequence sharded over the ranks (ids and targets are sharded
            in place, restored on exit) and SDPA on the CPU flash kernel."""
            ac = torch.autocast("cpu", dtype=low_dtype(plan)) if plan.precision != "fp32" else contextlib.nullcontext()
            with context_parallel(mesh, buffers=[ids, targets], buffer_seq_dims=[1, 1]), \
                    sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                with ac:  # each rank's shard as a tensor of its own, as a data loader hands it over
                    loss = model(ids.clone(), targets.clone())
                return fn(loss)

        rec = SavedTensors(model)
        regions: dict[str, int] = {}

        def backward(loss):  # after the recorded forward: what it saved, then its backward
            for st, region in rec.storages.values():
                regions[region] = regions.get(region, 0) + st.nbytes()
            loss.backward()
            return loss

        with rec:
            loss = sharded(backward)
        losses = [torch.zeros(()) for _ in range(world)]
        dist.all_gather(losses, loss.detach().float())
        for w in params:  # the CP group averages its gradients, as a data-parallel group does
            dist.all_reduce(w.grad)
            w.grad /= world
        grads = tensor_bytes(w.grad for w in params)
        opt.step()
        result = {"params_bytes": tensor_bytes(params), "grads_bytes": grads,
                  "optimizer_bytes": optimizer_state_bytes(opt), "activations_bytes": sum(regions.values()),
                  "regions": regions, "unsharded_loss": unsharded_loss,
                  "loss": float(sum(losses) / world),  # the ranks' equal shares of the tokens
                  # what the first layer keeps, tensor by tensor (bytes, shape, dtype, local shape, placement)
                  "saved_layer0": [list(rec.packed_sizes[k]) for k, (_, region) in rec.storages.items()
                                   if region == "layer 0"]}
        opt.zero_grad(set_to_none=True)
        result["flops"], _ = local_flops(lambda: sharded(lambda loss: loss.backward()))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # no rank tears down gloo while another still has work in flight
    finally:
        dist.destroy_process_group()


def run_context_parallel(layout: Layout, spec: ModelSpec, name: str) -> list:
    """Run the layout's context parallelism in cp local processes; one Case per rank."""
    from dataclasses import replace

    from ..estimate.recipe import recipe
    from .distributed import run_ranks
    from .run import TERMS, Case, predict

    check(layout)
    results = run_ranks(_worker, layout.cp, {"spec": spec.model_dump(), "plan": layout.plan.model_dump()})
    # the planner's per-GPU figure is the peak rank's, which keeps the copied attention output
    # (conventions.toml `cp_ring_output_copy`); the last rank does not
    peak = predict(layout, "cpu")
    last = predict(layout, "cpu", r=replace(recipe(layout.plan), cp_ring_output_copy=False))
    cases = []
    for r, measured in enumerate(results):
        predicted = last if r == layout.cp - 1 else peak
        case = Case(f"{name} — rank {r}", {k: predicted[k] for k in TERMS}, {k: measured[k] for k in TERMS},
                    extra={"rank": r, "activation_regions": {"measured": measured["regions"],
                                                             "predicted": predicted["parts"]},
                           "saved_layer0": measured["saved_layer0"],
                           "loss": {"context_parallel": measured["loss"], "unsharded": measured["unsharded_loss"]},
                           "output_copy": float(peak["activations_bytes"] - last["activations_bytes"]) * (r < layout.cp - 1)})
        cp = layout.cp
        case.notes.append(f"FLOPs: torch's ring skips the K/V blocks the causal mask hides, so this rank's attention "
                          f"kernels run {cp + 1}/{2 * cp} of the (s/{cp}) x s scores the planner counts")
        if r < cp - 1:
            case.notes.append("this rank merges a partial block into its attention output (load balancing), which "
                              "comes back contiguous in (b, heads, s, d): the output projection keeps a copy of it "
                              "(conventions.toml cp_ring_output_copy)")
        cases.append(case.finish())
    return cases
