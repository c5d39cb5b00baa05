"""Pipeline parallelism run for real: the plan's model cut into stages, one process per
pipeline rank (gloo on the CPU), stepped by the `torch.distributed.pipelining` schedule of the
plan's name (`estimate.torch_schedules.TORCH_CLASSES`).

Each rank measures, over one training step:

* the peak of the bytes saved for backward that are alive at once (distinct storages,
  parameters excluded): every tensor autograd saves is recorded with a weak reference and the
  (stage, micro-batch) whose forward saved it; after each stage forward and each loss, the
  storages of the saved tensors still alive are summed. A saved tensor dies when autograd
  frees it (the full backward, or the weight-gradient pass of a split backward) or when the
  schedule drops the graph holding it;
* the (stage, micro-batch) pairs alive at that peak: the micro-batches in flight;
* parameter, gradient and optimizer-state bytes after one optimizer step, and FLOPs of the step.

The prediction is the planner's (`stage_memory`) for that rank under the `torch` convention:
its layers, the embedding on the rank holding the first stage, the head and loss on the rank
holding the last (rank 0 under the V-shaped zbv and dualpipev), micro-batches in flight and live
losses from `torch_schedules`.
"""

from __future__ import annotations

import json
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np

from ..errors import PlanError
from ..estimate import torch_schedules as ts
from ..plan import Layout
from ..specs.model import ModelSpec
from .distributed import join_gloo

JOIN_TIMEOUT_S = 600  # a step of the scaled-down model takes seconds; a hung rank is killed


def chunk_layers(layout: Layout, name: str) -> list[int]:
    """Layers of each model stage (chunk) in model order: rank r's layers split equally over its
    vpp chunks, placed where the schedule's stage-to-rank mapping puts them."""
    p, v = layout.pp, layout.vpp
    owner = {}
    for r, stages in enumerate(ts.stage_ranks(name, p, v)):
        for s in stages:
            owner[s] = r
    return [layout.stage_layers[owner[s]] // v for s in range(p * v)]


def check(layout: Layout, name: str) -> None:
    """What this run measures, checked before any process starts."""
    plan = layout.plan
    p, m, v = layout.pp, layout.micro_batches, layout.vpp
    if plan.framework != "torch":
        raise PlanError("framework", "validate runs pipelines with torch.distributed.pipelining: --framework torch")
    if plan.precision != "fp32":
        raise PlanError("precision", "validate runs pipelines in fp32 (--precision fp32)")
    if layout.tp > 1 or layout.dp > 1 or layout.cp > 1 or layout.ep > 1:
        raise PlanError("pp", "validate runs pipelines alone (tp = dp = cp = ep = 1)")
    for field, bad, rule in (("recompute", plan.recompute != "none", "without recompute (--recompute none)"),
                             ("dropout", plan.dropout > 0, "without dropout"),
                             ("finetune", plan.finetune != "full", "in full training")):
        if bad:
            raise PlanError(field, f"validate runs pipelines {rule}")
    if any(n % v for n in layout.stage_layers):
        raise PlanError("vpp", f"each rank's layers {layout.stage_layers} must split into {v} equal stages")
    if name == "1f1b" and m < p:
        raise PlanError("gbs", f"torch's Schedule1F1B needs micro-batches ({m}) >= pp ({p})")
    if name == "dualpipev" and m < 2 * p:
        raise PlanError("gbs", f"torch's ScheduleDualPipeV needs micro-batches ({m}) >= its 2 x pp = {2 * p} stages")
    if name in ("interleaved", "zb") and m % max(1, m // p):
        raise PlanError("gbs", f"torch's {ts.TORCH_CLASSES[name]} needs micro-batches ({m}) divisible by "
                        f"their rounds ({max(1, m // p)})")


# ---- the worker ------------------------------------------------------------------------
class _Saved:
    """What autograd holds for one saved tensor: alive exactly as long as autograd keeps the
    tensor saved (the tensor itself may outlive that, e.g. a stage's receive buffer)."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class LiveSaved:
    """Saved-for-backward tensors, each with the (stage, micro-batch) that saved it, followed
    through weak references to autograd's handle on them: `sample()` sums the distinct
    storages autograd still holds."""

    def __init__(self, exclude):
        import torch

        from .measure import _key

        self._key = _key
        self.excluded = {_key(t.untyped_storage()) for t in exclude}
        self.records: list[tuple[weakref.ref, int, int, tuple]] = []
        self.tag: tuple = ("none", -1)
        self.closed: set[tuple] = set()  # (stage, micro-batch) whose backward has finished
        self.peak = {"bytes": 0, "tags": [], "at": None}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda saved: saved.t)

    def _pack(self, t):
        st = t.untyped_storage()
        key = self._key(st)
        # Hold the tensor's data only (`detach`): the tensor autograd hands a pack hook when a
        # node saves its own output (rsqrt, SDPA's output and log-sum-exp, log-softmax) carries
        # that node as grad_fn, and holding it would tie node -> packed object -> tensor -> node in
        # a cycle through C++ that Python's collector cannot see. A full backward releases the
        # saved tensors and so breaks the cycle; the input-gradient pass of a split backward runs
        # with retain_graph=True and the weight-gradient pass never visits the input-only nodes,
        # so the cycle would keep them (and what they saved) alive for good, which torch without
        # hooks does not (autograd keeps an output's data without its grad_fn,
        # torch/csrc/autograd/saved_variable.cpp); unpacking rebuilds the grad_fn from the saved
        # metadata, so the unpacked tensor is what autograd would have used.
        saved = _Saved(t.detach())
        if key not in self.excluded:
            self.records.append((weakref.ref(saved), key, st.nbytes(), self.tag))
        return saved

    def alive(self) -> dict[tuple, int]:
        """Bytes of the distinct storages autograd holds now, by the (stage, micro-batch) that
        saved them (a storage belongs to the first that saved it)."""
        self.records = [r for r in self.records if r[0]() is not None]
        sizes: dict[int, int] = {}
        owner: dict[int, tuple] = {}
        for _, key, nbytes, tag in self.records:
            sizes[key] = nbytes
            owner.setdefault(key, tag)
        by_tag: dict[tuple, int] = {}
        for key, tag in owner.items():
            by_tag[tag] = by_tag.get(tag, 0) + sizes[key]
        return by_tag

    def sample(self, where) -> None:
        by_tag = self.alive()
        total = sum(by_tag.values())
        if total > self.peak["bytes"]:
            self.peak = {"bytes": total, "tags": sorted(t for t in by_tag if t not in self.closed), "at": where,
                         "by_tag": [[*t, b] for t, b in sorted(by_tag.items())],
                         "finished_bytes": sum(b for t, b in by_tag.items() if t in self.closed),
                         "finished": len([t for t in by_tag if t in self.closed])}

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def _track_backwards(stage, closed: set, n_stages: int) -> None:
    """Mark (stage, micro-batch) finished when its full backward, or under a split backward its
    weight-gradient pass, has run; the loss of a micro-batch with the last stage's."""
    full, weight = stage.backward_one_chunk, stage.backward_weight_one_chunk
    last = stage.stage_index == n_stages - 1

    def close(mb):
        closed.add((stage.stage_index, mb))
        if last:
            closed.add((-1, mb))

    def backward_one_chunk(bwd_chunk_id, *args, full_backward=True, **kwargs):
        out = full(bwd_chunk_id, *args, full_backward=full_backward, **kwargs)
        if full_backward:
            close(bwd_chunk_id)
        return out

    def backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs):
        out = weight(bwd_chunk_id, *args, **kwargs)
        close(bwd_chunk_id)
        return out

    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def _chunk_module(model, lo: int, hi: int, first: bool, last: bool):
    """Stage [lo, hi) of a `DecoderLM`: its blocks, with the embedding on the first stage and
    the final norm and output head on the last; like `DecoderLM.forward`, each stage's
    forward makes its own RoPE tables."""
    import torch
    from torch import nn

    from .models import rope_tables

    class Chunk(nn.Module):
        def __init__(self):
            super().__init__()
            self.spec, self.first, self.last = model.spec, first, last
            self.blocks = nn.ModuleList(model.blocks[lo:hi])
            if first:
                self.embed, self.pos = model.embed, model.pos
            if last:
                self.norm, self.head = model.norm, model.head

        def forward(self, x):
            if self.first:
                ids = x.clone()  # each micro-batch's ids in a tensor of its own (not a view of the batch)
                x = self.embed(ids)
                if self.pos is not None:
                    x = x + self.pos(torch.arange(ids.shape[1]))
            s = x.shape[1]
            cos = sin = None
            if self.spec.position == "rotary":
                cos, sin = rope_tables(s, self.spec.dim_head, x.device, x.dtype)
            for blk in self.blocks:
                x = blk(x, cos, sin, None)
            return self.head(self.norm(x)) if self.last else x

    return Chunk()


def _worker(rank: int, world: int, port: int, payload: dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_sched

    from ..plan import Plan, resolve
    from .measure import counted_flops, tensor_bytes
    from .step import build_model, make_optimizer, optimizer_state_bytes

    join_gloo(rank, world, port)
    try:
        spec, plan = ModelSpec(**payload["spec"]), Plan(**payload["plan"])
        name = plan.schedule
        layout = resolve(plan, spec)
        p, m, v = layout.pp, layout.micro_batches, layout.vpp
        model = build_model(spec, plan, "cpu")
        model.train()
        sizes = chunk_layers(layout, name)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        mine = ts.stage_ranks(name, p, v)[rank]
        n_stages = p * v
        chunks = {s: _chunk_module(model, bounds[s], bounds[s + 1], s == 0, s == n_stages - 1) for s in mine}
        params = [w for c in chunks.values() for w in c.parameters()]
        rec = LiveSaved(params)
        counters = dict.fromkeys(mine, 0)

        def pre(s):
            def hook(module, args):
                if torch.is_grad_enabled():
                    rec.tag = (s, counters[s])
                    counters[s] += 1
            return hook

        def post(s):
            def hook(module, args, out):
                if torch.is_grad_enabled():
                    rec.sample(f"forward stage {s}")
            return hook

        for s, c in chunks.items():
            c.register_forward_pre_hook(pre(s))
            c.register_forward_hook(post(s))

        losses = [0]

        def loss_fn(logits, target):
            rec.tag = (-1, losses[0])  # what the loss keeps: tagged apart from the last stage's layers
            losses[0] += 1
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.clone().reshape(-1))
            rec.sample("loss")
            return loss

        stages = [PipelineStage(chunks[s], s, n_stages, torch.device("cpu")) for s in mine]
        for st in stages:
            _track_backwards(st, rec.closed, n_stages)
        cls = getattr(torch_sched, ts.TORCH_CLASSES[name])
        schedule = cls(stages[0] if cls in (torch_sched.ScheduleGPipe, torch_sched.Schedule1F1B) else stages,
                       n_microbatches=m, loss_fn=loss_fn)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, spec.vocab, (m * layout.mbs, layout.seq_len), generator=g)
        args = (ids,) if 0 in mine else ()
        kwargs = {"target": ids} if n_stages - 1 in mine else {}
        opt = make_optimizer(plan.optimizer, params)
        # The first step infers the stages' shapes with a forward and backward of its own
        # (PipelineStage's dynamic metadata inference): a warm-up, then a measured step.
        schedule.step(*args, **kwargs)
        for w in params:
            w.grad = None
        rec.records.clear()
        rec.closed.clear()
        counters.update(dict.fromkeys(mine, 0))
        losses[0] = 0
        dist.barrier()
        with rec:
            schedule.step(*args, **kwargs)
        peak = rec.peak
        grads = tensor_bytes(w.grad for w in params)
        opt.step()
        result = {
            "params_bytes": tensor_bytes(params), "grads_bytes": grads,
            "optimizer_bytes": optimizer_state_bytes(opt), "activations_bytes": peak["bytes"],
            "peak_at": peak["at"], "in_flight_tags": [list(t) for t in peak["tags"]],
            "forwards": counters, "by_tag": peak["by_tag"],
            "finished_bytes": peak["finished_bytes"], "finished": peak["finished"],
        }
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        result["flops"], _ = counted_flops(lambda: schedule.step(*args, **kwargs), per_module=False)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ---- prediction ------------------------------------------------------------------------
def predict_ranks(layout: Layout, name: str) -> list[dict]:
    """The planner's per-rank figures under the torch convention (see the module's note)."""
    from ..estimate import activations as act
    from ..estimate.flops import step_flops
    from ..estimate.memory import layout_inputs, numbers_for, stage_memory
    from ..estimate.recipe import recipe

    p, m, v = layout.pp, layout.micro_batches, layout.vpp
    ranks = np.arange(p)
    holds = ts.stage_ranks(name, p, v)
    first = np.array([0 in s for s in holds], dtype=float)
    last = np.array([p * v - 1 in s for s in holds], dtype=float)
    inputs = layout_inputs(layout)
    inputs.update(first=first, last=last,
                  in_flight_mb=ts.in_flight(name, ranks, p, m, v),
                  logits_in_flight=ts.logits_in_flight(name, m, p), head_in_flight=ts.heads_in_flight(name, m, p))
    mem = stage_memory(numbers_for(layout), recipe(layout.plan), **inputs)
    chunks = ts.chunks_in_flight(name, ranks, p, m, v)
    # every stage's forward makes its own RoPE tables (and eager attention's mask): one set per
    # chunk in flight, where the planner counts one per layer-equivalent micro-batch
    per_set = mem["activation_parts"]["stage_tensors"] / np.maximum(inputs["in_flight_mb"], 1e-9)
    stage_sets = per_set * (chunks - inputs["in_flight_mb"])
    out = []
    for r in range(p):
        fl = step_flops(layout.model, tokens=layout.mbs * layout.seq_len, seq=layout.seq_len,
                        dense_layers=layout.stage_dense_layers[r], moe_layers=layout.stage_moe_layers[r],
                        head=last[r], attention_eager=layout.plan.attention == "eager",
                        recompute=act.RECOMPUTE_CODE["none"], vocab_padded=layout.vocab_padded)
        out.append({
            "params_bytes": float(mem["params"][r]), "grads_bytes": float(mem["grads"][r]),
            "optimizer_bytes": float(mem["optimizer"][r]),
            "activations_bytes": float(mem["activations"][r] + stage_sets[r]),
            "flops": float(fl["hardware"]) * m,
            "in_flight": float(chunks[r]), "logits_in_flight": float(inputs["logits_in_flight"]) * last[r],
            "heads_in_flight": float(inputs["head_in_flight"]) * last[r],
        })
    return out


def run_pipeline(layout: Layout, spec: ModelSpec, name: str) -> list:
    """Run the layout's pipeline in pp local processes; one Case per rank."""
    import torch.multiprocessing as mp

    from .distributed import free_port
    from .run import TERMS, Case

    plan = layout.plan
    check(layout, plan.schedule)
    world = layout.pp
    payload = {"spec": spec.model_dump(), "plan": plan.model_dump()}
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_worker, args=(world, free_port(), payload, out), nprocs=world,
                                 join=False, start_method="spawn")
        try:
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            while not ctx.join(timeout=5):
                if time.monotonic() > deadline:
                    raise PlanError("pp", f"the pipeline run did not finish in {JOIN_TIMEOUT_S} s")
        except mp.ProcessExitedException:
            if not all(Path(out, f"rank{r}.json").is_file() for r in range(world)):
                raise
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    predicted = predict_ranks(layout, plan.schedule)
    cases = []
    for r, (meas, pred) in enumerate(zip(results, predicted, strict=True)):
        tags = [t for t in meas["in_flight_tags"] if t[0] >= 0]
        measured_flight = len(tags)
        measured_logits = len(meas["in_flight_tags"]) - measured_flight
        case = Case(f"{name} — rank {r}", {k: pred[k] for k in TERMS}, {k: meas[k] for k in TERMS},
                    extra={"rank": r, "schedule": ts.TORCH_CLASSES[plan.schedule],
                           "in_flight": {"predicted": pred["in_flight"], "measured": measured_flight,
                                         "stages": sorted({t[0] for t in tags})},
                           "logits_in_flight": {"predicted": pred["logits_in_flight"],
                                                "measured": measured_logits},
                           "heads_in_flight": {"predicted": pred["heads_in_flight"],
                                               "measured": sum(t[0] == layout.pp * layout.vpp - 1 for t in tags)},
                           "peak_at": meas["peak_at"],
                           "finished": {"micro_batches": meas["finished"], "bytes": meas["finished_bytes"]}})
        if meas["finished"]:
            case.notes.append(
                f"{meas['finished_bytes'] / 2**20:.2f} MiB of the peak belong to {meas['finished']} stage micro-batches "
                "whose full backward or weight-gradient pass has run: something still references their autograd "
                "graph; the planner counts nothing of a micro-batch after that pass")
        cases.append(case.finish())
    return cases
