"""Expert parallelism measured across ranks: a mixture-of-experts reference model whose routed
experts are split over `ep` local processes (gloo), each rank holding experts/ep of them, with
the routed copies dispatched to their expert's rank and combined back by
`torch.distributed.nn.functional.all_to_all_single` (differentiable; gloo runs all-to-all on
the CPU), the split sizes exchanged first by an all-to-all of the per-expert counts.

Under `--framework torch` each MoE layer runs like transformers 5's grouped experts
(`models.MoE._grouped`): the routed copies sorted by expert and gathered, sent to the experts'
ranks, each local expert run on the copies it received (from every rank), sent back, weighted by
the fp32 gate weights, put back in order and summed over each token's k copies. Under
`--framework megatron` like Megatron-Core's experts (megatron/core/transformer/moe/
token_dispatcher.py with experts.py): each copy's 16-bit gate weight travels with it to the
expert, which applies it inside its weighted SwiGLU (`models.WeightedSwiGLUFn`), and the combine
is a fused un-permuting sum that keeps only the index (`models.IndexAddFn`); weights in bf16,
fp32 main gradients and master copies. Dense parameters are replicated (their gradients
all-reduced); each expert's parameters live on one rank (expert-data-parallel group of one).

Routing is fixed so the measurement is deterministic: `balanced` gives every expert the same
number of routed copies (copy j of token t goes to expert (t + j) mod E), what the planner's
uniform routing prices; `skewed` sends 70% of the copies to rank 0's experts (world size 2),
to show the spread that routing imbalance puts on the ranks. The router still runs and its
probabilities at the chosen experts are the gate weights (a `gather`, which keeps the int64
indices as `topk` does).
"""

from __future__ import annotations

import warnings

from ..errors import PlanError
from ..plan import Layout
from ..specs.model import ModelSpec
from .distributed import finish_rank, join_gloo, run_ranks

ROUTINGS = ("balanced", "skewed")
SKEW_TO_RANK0 = 0.7  # the skewed routing's share of routed copies sent to rank 0's experts


def fixed_routing(tokens: int, experts: int, k: int, world: int, routing: str):
    """(tokens, k) int64 expert choices: balanced, or 70/30 between two ranks' experts."""
    import torch

    t = torch.arange(tokens).unsqueeze(1)
    j = torch.arange(k).unsqueeze(0)
    if routing == "balanced":
        return (t + j) % experts
    local = experts // world
    copy = t * k + j
    group = (copy % 10 >= round(SKEW_TO_RANK0 * 10)).long()  # 7 of every 10 copies to rank 0
    return group * local + (t + j) % local  # two copies of a token in one group differ (local >= 2)


def ep_forward(self, x):
    """MoE.forward with the routed experts split over the ranks (see the module docstring)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.nn.functional import all_to_all_single as _a2a

    def all_to_all_single(*args):
        # torch 2.13 marks this differentiable all-to-all deprecated in favour of a private
        # functional-collectives API; it still runs on gloo, and its warning would fill the output
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return _a2a(*args)

    b, s, h = x.shape
    world, k, n_exp = self.ep_world, self.spec.top_k, self.spec.experts
    local = n_exp // world
    flat = x.reshape(-1, h)
    probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float)
    chosen = fixed_routing(flat.shape[0], n_exp, k, world, self.ep_routing).to(flat.device)
    weights = probs.gather(1, chosen)
    expert_ids, perm = torch.sort(chosen.reshape(-1), stable=True)
    token = perm // k
    inputs = flat[token]
    megatron = self.gate_in_act  # Megatron-Core: the gate weights travel with the copies into the activation
    if megatron:
        gate = weights.to(x.dtype).reshape(-1)[perm]
        payload = torch.cat([inputs, gate.unsqueeze(-1)], dim=-1)
    else:
        gate = weights.reshape(-1)[perm]
        payload = inputs
    counts = torch.bincount(expert_ids, minlength=n_exp)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)  # [source][local expert] copies this rank receives
    send = counts.view(world, local).sum(1).tolist()
    recv_grid = recv_counts.view(world, local).tolist()
    recv_splits = [sum(r) for r in recv_grid]
    self.ep_received = sum(recv_splits)  # routed copies this rank's experts run
    up = self.experts[0].up
    dtype = getattr(up, "base", up).weight.dtype
    width = payload.shape[-1]
    with torch.autocast(device_type=flat.device.type, enabled=False):
        received = all_to_all_single(payload.new_empty(sum(recv_splits), width), payload.to(dtype),
                                     recv_splits, send)
        offsets = [[0] * local for _ in range(world)]
        pos = 0
        for src in range(world):
            for e in range(local):
                offsets[src][e] = pos
                pos += recv_grid[src][e]
        outs = {}
        for e, expert in enumerate(self.experts):  # each local expert on its copies from every rank
            rows = [slice(offsets[src][e], offsets[src][e] + recv_grid[src][e]) for src in range(world)]
            if sum(recv_grid[src][e] for src in range(world)):
                if megatron:  # the weighted SwiGLU (models.WeightedSwiGLUFn) takes the copies' gate weights
                    y = expert(torch.cat([received[r, :h] for r in rows]), torch.cat([received[r, h:] for r in rows]))
                else:
                    y = expert(torch.cat([received[r] for r in rows]))
                outs[e] = y.split([recv_grid[src][e] for src in range(world)])
        back = torch.cat([outs[e][src] for src in range(world) for e in range(local) if recv_grid[src][e]])
        returned = all_to_all_single(back.new_empty(inputs.shape[0], h), back, send, recv_splits)
        if megatron:  # a plain un-permuting sum: the fused unpermute keeps only the index
            from .models import IndexAddFn

            out = IndexAddFn.apply(torch.zeros_like(flat), token, returned)
        else:
            weighted = returned * gate.unsqueeze(-1)
    if not megatron:
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        out = weighted[inverse].view(-1, k, h).sum(dim=1).to(flat.dtype)
    return self.combine(flat, out, (b, s, h))


def shard_experts(model, rank: int, world: int, routing: str) -> None:
    """Keep this rank's experts/world routed experts in every MoE layer and route them by `ep_forward`."""
    import types

    from torch import nn

    for blk in model.blocks:
        moe = blk.mlp
        if not hasattr(moe, "experts"):
            continue
        local = len(moe.experts) // world
        moe.experts = nn.ModuleList(list(moe.experts)[rank * local:(rank + 1) * local])
        moe.ep_world, moe.ep_routing = world, routing
        moe.forward = types.MethodType(ep_forward, moe)


def _worker(rank: int, world: int, port: int, payload: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from ..plan import Plan
    from .measure import SavedTensors, tensor_bytes
    from .step import build_model, make_optimizer

    join_gloo(rank, world, port)
    try:
        spec, plan = ModelSpec(**payload["spec"]), Plan(**payload["plan"])
        model = build_model(spec, plan, "cpu")  # the same seed on every rank: the same weights
        shard_experts(model, rank, world, payload["routing"])
        megatron = plan.framework == "megatron"
        if megatron:  # 16-bit weights, fp32 main_grad buffers and fp32 master copies (as run.measure)
            from .step import low_dtype

            model.to(low_dtype(plan))
        params = list(model.parameters())
        expert = {id(p) for blk in model.blocks if hasattr(blk.mlp, "experts") for p in blk.mlp.experts.parameters()}
        masters = [p.detach().float().clone().requires_grad_() for p in params] if megatron else None
        opt = make_optimizer(plan.optimizer, masters if megatron else params)
        if megatron:
            for p in params:
                p.main_grad = torch.zeros_like(p, dtype=torch.float32)

                def hook(p):
                    p.main_grad.add_(p.grad)
                    p.grad = None
                p.register_post_accumulate_grad_hook(hook)
        g = torch.Generator().manual_seed(1 + rank)  # each data-parallel rank its own batch
        ids = torch.randint(0, spec.vocab, (payload["mbs"], payload["seq_len"]), generator=g)
        autocast = plan.precision != "fp32" and not megatron

        def forward():
            if autocast:
                from .step import low_dtype

                with torch.autocast("cpu", dtype=low_dtype(plan)):
                    return model(ids, ids)
            return model(ids, ids)

        rec = SavedTensors(model)
        with rec:
            loss = forward()
        regions = rec.by_region()
        saved = rec.bytes_alive()
        received = [blk.mlp.ep_received for blk in model.blocks if hasattr(blk.mlp, "ep_received")]
        loss.backward()
        grad_of = (lambda p: p.main_grad) if megatron else (lambda p: p.grad)  # noqa: E731
        for p in params:  # dense parameters are replicated: their gradients averaged over the ranks
            if id(p) not in expert and grad_of(p) is not None:
                dist.all_reduce(grad_of(p))
                grad_of(p).div_(world)
        grads = tensor_bytes(grad_of(p) for p in params)
        if megatron:
            for m, p in zip(masters, params, strict=True):
                m.grad = p.main_grad
        opt.step()
        if megatron:
            with torch.no_grad():
                for m, p in zip(masters, params, strict=True):
                    p.copy_(m)
                    m.grad = None
                    p.main_grad.zero_()
        from .step import optimizer_state_bytes

        result = {"params_bytes": tensor_bytes(params), "grads_bytes": grads,
                  "optimizer_bytes": optimizer_state_bytes(opt) + (tensor_bytes(masters) if megatron else 0),
                  "activations_bytes": saved, "regions": regions, "copies_received": received}
        opt.zero_grad(set_to_none=True)

        def step():
            out = forward()
            out.backward()
            return out
        finish_rank(result, step, rank, out_dir)
    finally:
        dist.destroy_process_group()


def check(layout: Layout, routing: str = "balanced") -> None:
    """What the expert-parallel run covers, checked before any process starts."""
    plan, spec = layout.plan, layout.model
    if routing not in ROUTINGS:
        raise PlanError("routing", f"must be one of {', '.join(ROUTINGS)}; got {routing!r}")
    if plan.framework not in ("torch", "megatron"):
        raise PlanError("framework", "validate measures expert parallelism with transformers' grouped experts "
                        "(--framework torch) or Megatron-Core's (--framework megatron)")
    if plan.framework == "megatron" and (plan.precision == "fp32" or spec.mlp != "swiglu" or not plan.master_weights):
        raise PlanError("framework", "validate's Megatron expert-parallel run is 16-bit with fp32 master copies and "
                        "SwiGLU experts (the weighted SwiGLU): --precision bf16 and a SwiGLU MoE")
    if layout.tp > 1 or layout.pp > 1 or layout.cp > 1 or layout.zero > 0:
        raise PlanError("ep", "validate measures expert parallelism alone: tp = pp = cp = 1, zero 0")
    if layout.ep != layout.dp:
        raise PlanError("ep", f"validate spreads the experts over every data-parallel rank: ep ({layout.ep}) "
                        f"must equal dp ({layout.dp})")
    if plan.framework == "torch" and ((spec.experts_impl or "grouped") != "grouped" or plan.fused_kernels):
        raise PlanError("ep", "validate's expert-parallel run under --framework torch dispatches like transformers' "
                        "grouped experts")
    if plan.recompute != "none" or plan.finetune != "full" or plan.dropout > 0:
        raise PlanError("ep", "validate's expert-parallel run covers full training without recompute or dropout")
    if routing == "skewed" and layout.ep != 2:
        raise PlanError("routing", "the skewed routing splits the copies 70/30 between two ranks: ep 2")
    tokens = layout.mbs * layout.seq_len
    if (tokens * spec.top_k) % spec.experts:
        raise PlanError("seq_len", f"balanced routing gives every expert the same number of copies: tokens x top-k "
                        f"({tokens} x {spec.top_k}) must be a multiple of the experts ({spec.experts})")


def run_expert_parallel(layout: Layout, spec: ModelSpec, name: str, routing: str = "balanced") -> list:
    """Run the layout's ep ranks and compare each with the planner's per-rank prediction."""

    from .run import TERMS, Case, predict

    check(layout, routing)
    world = layout.gpus
    payload = {"spec": spec.model_dump(), "plan": layout.plan.model_dump(), "routing": routing,
               "mbs": layout.mbs, "seq_len": layout.seq_len}
    results = run_ranks(_worker, world, payload)
    predicted = predict(layout, "cpu")
    cases = []
    for r, measured in enumerate(results):
        case = Case(f"{name}, {routing} routing — rank {r}", {k: predicted[k] for k in TERMS},
                    {k: measured[k] for k in TERMS},
                    extra={"routing": routing, "copies_received": measured["copies_received"],
                           "copies_sent": layout.mbs * layout.seq_len * spec.top_k, "activation_regions": {"measured": measured["regions"],
                                                                      "predicted": predicted["parts"]}})
        if routing == "skewed":
            case.notes.append(f"routing skewed {SKEW_TO_RANK0:.0%}/{1 - SKEW_TO_RANK0:.0%} between the ranks' "
                              "experts; the planner prices uniform routing")
        cases.append(case.finish())
    return cases


# one process per rank on the CPU: a small model, two layers, four experts
EP_SCALE_DEFAULTS = dict(layers=2, hidden=64, vocab=512, seq_len=64, mbs=1, experts=4)


def validate_expert_parallel(plan, scale=None, device: str = "cpu", progress=None,
                             routing: str = "balanced") -> dict:
    """ep > 1: the scaled-down MoE model with its experts split over ep local processes."""
    from ..plan import resolve
    from .run import Scale, _describe, resolve_device, scale_model

    if resolve_device(device) != "cpu":
        raise PlanError("device", "expert parallelism is validated on the CPU (gloo) here")
    full = resolve(plan)
    spec = full.model
    if not spec.is_moe:
        raise PlanError("ep", f"expert parallelism needs a mixture-of-experts model; {spec.name} is dense")
    scale = scale or Scale()
    d = EP_SCALE_DEFAULTS
    eff = Scale(layers=scale.layers or d["layers"], hidden=scale.hidden or d["hidden"],
                vocab=scale.vocab or d["vocab"], seq_len=scale.seq_len or min(full.seq_len, d["seq_len"]),
                mbs=scale.mbs or min(plan.mbs, d["mbs"]), experts=scale.experts or d["experts"])
    small = scale_model(spec, eff)
    small_plan = plan.model_copy(update={
        "model": small.name, "hf_config": None, "seq_len": eff.seq_len, "mbs": eff.mbs, "gbs": None,
        "gpus": full.dp * full.tp * full.pp * full.cp, "dp": None, "stage_layers": None})
    layout = resolve(small_plan, small)
    check(layout, routing)
    name = (f"{spec.name} scaled to {_describe(small)}, {plan.precision}/{plan.framework}, ep {layout.ep} "
            f"dp {layout.dp}, b={layout.mbs} s={layout.seq_len}, cpu")
    if progress:
        progress(f"running {name}")
    cases = run_expert_parallel(layout, small, name, routing)
    worst = max((abs(e) for c in cases for e in c.rel_error.values()), default=0.0)
    return {"device": "cpu", "cases": [c.to_json() for c in cases], "max_abs_rel_error": worst}
