"""A torchtitan 0.3 launch script for a plan.

torchtitan 0.3 reads no job files: a run starts from one of its own Python configs
(`--module llama3 --config llama3_8b`, torchtitan/models/*/config_registry.py) and overrides
its fields on the command line (`--training.local_batch_size 2`, parsed by tyro in
torchtitan/config/manager.py ConfigManager). The model is the config's, so the export picks
the config whose model is the planned one (TORCHTITAN_CONFIGS, checked against the configs
torchtitan builds by tests/test_export_frameworks.py) and refuses a model no config builds.
"""

from __future__ import annotations

import shlex

from ..errors import PlanError
from ..estimate.recipe import recipe
from ..plan import torchtitan_virtual_stages

# the planner's schedules by the names torchtitan passes to torch.distributed.pipelining's
# get_schedule_class (torch/distributed/pipelining/schedules.py schedule_map): zb is torch's
# ScheduleInterleavedZeroBubble (ZB-H1 with one stage per rank), not the V-shaped ZBVZeroBubble
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb": "InterleavedZeroBubble",
             "looped_bfs": "LoopedBFS", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
MULTI_STAGE = ("interleaved", "looped_bfs", "zbv", "dualpipev")  # several stages per rank: --vpp
# torchtitan 0.3's optimizers (components/optimizer/optimizer.py _resolve_optimizer_factory)
OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam"}


class TorchtitanConfig:
    """One of torchtitan 0.3's configs: the catalog model its model is, with the fields in
    which torchtitan's model differs from the catalog's (`differs`), its rotary cache length
    and the precision its converters train in."""

    def __init__(self, module: str, config: str, model: str, max_seq_len: int, precision: str = "bf16",
                 differs: dict | None = None):
        self.module, self.config, self.model = module, config, model
        self.max_seq_len, self.precision, self.differs = max_seq_len, precision, differs or {}


# torchtitan 0.3.0 torchtitan/models/{llama3,qwen3,deepseek_v3}/config_registry.py and the
# flavors they build (__init__.py model_registry)
TORCHTITAN_CONFIGS = (
    TorchtitanConfig("llama3", "llama3_8b", "llama-3.1-8b", 131072),
    TorchtitanConfig("llama3", "llama3_70b", "llama-3.1-70b", 131072),
    # llama3_405b converts its linears (all but lm_head) to Float8 (torchao)
    TorchtitanConfig("llama3", "llama3_405b", "llama-3.1-405b", 131072, precision="fp8"),
    TorchtitanConfig("qwen3", "qwen3_30b_a3b", "qwen3-30b-a3b", 40960),
    # its RMSNorms use eps 1e-5 where DeepSeek-V3's config.json has 1e-6
    TorchtitanConfig("deepseek_v3", "deepseek_v3_671b", "deepseek-v3", 16384, differs={"norm_eps": 1e-5}),
)
# ModelSpec fields that do not change the network torchtitan builds
NOT_ARCHITECTURE = {"name", "source", "family", "published_params", "published_active_params", "max_position",
                    "experts_impl"}


def architecture(spec, differs: dict | None = None) -> dict:
    d = {k: v for k, v in spec.model_dump().items() if k not in NOT_ARCHITECTURE}
    if d.get("mlp") == "swiglu" and d.get("activation") in ("silu", "swish"):
        d["activation"] = None  # SiLU is the gated MLP's single kernel either way
    d.update(differs or {})
    return d


def _show(v) -> str:
    if isinstance(v, dict):  # rope scaling: its kind, factor and original context
        return f"{v['kind']} x{v['factor']:g} from {v['original_max_position']:,}"
    return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def torchtitan_config(m, precision: str) -> TorchtitanConfig:
    """The torchtitan config whose model is `m`, or a PlanError naming the difference."""
    from ..specs import catalog

    mine = architecture(m)
    nearest = None
    for cfg in TORCHTITAN_CONFIGS:
        theirs = architecture(catalog.model(cfg.model), cfg.differs)
        diff = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
        if not diff:
            if precision != cfg.precision:
                raise PlanError("precision", f"torchtitan's {cfg.config} config trains in {cfg.precision} (its "
                                f"model converters); plan with --precision {cfg.precision} to export it")
            return cfg
        if nearest is None or len(diff) < len(nearest[1]):
            nearest = (cfg, diff)
    cfg, diff = nearest
    if len(diff) <= 3:
        theirs = architecture(catalog.model(cfg.model), cfg.differs)
        what = ", ".join(f"{k} {_show(mine.get(k))} where its model has {_show(theirs.get(k))}" for k in diff)
        raise PlanError("model", f"torchtitan 0.3 has no config for {m.name}: the nearest, {cfg.config}, "
                        f"differs in {what}")
    built = (c.model + "".join(f" with {k} {_show(v)}" for k, v in c.differs.items()) for c in TORCHTITAN_CONFIGS)
    raise PlanError("model", f"torchtitan 0.3 has no config for {m.name}; its configs build " + ", ".join(built))


def virtual_stage_options(layout, v: int) -> list[str]:
    """torchtitan's layer cut: equal (virtual) stages, or equal ones with the first and last one
    layer lighter (Llama 3 405B: 126 layers as 7, 8, ..., 8, 7 on 16 x 2, or on 16 x 8 one layer
    per virtual stage, the first holding only the embedding and the last only the head); with
    one stage per rank any other split is named module by module."""
    cut = torchtitan_virtual_stages(list(layout.stage_layers), v)
    if cut is None and v == 1:  # any split, one stage per rank: the modules of each, by name
        return ["--parallelism.module_fqns_per_model_part", *module_parts(list(layout.stage_layers))]
    if cut is None:
        raise PlanError("vpp" if v > 1 else "stage_layers",
                        f"torchtitan cuts the layers into equal stages, or equal ones with the first and last one "
                        f"layer lighter; {sum(layout.stage_layers)} layers as {list(layout.stage_layers)} on "
                        f"{layout.pp} x {v} stages is neither (choose another --vpp or --stage-layers)")
    per, fewer = cut
    return ["--parallelism.pipeline_parallel_layers_per_stage", str(per),
            "--parallelism.pipeline_parallel_first_stage_less_layers", str(fewer),
            "--parallelism.pipeline_parallel_last_stage_less_layers", str(fewer)]


def module_parts(split: list[int]) -> list[str]:
    """Each stage's modules as torchtitan names them (pipeline_parallel.py
    _generate_llm_fqn_per_model_part): the embedding first, then its layers, the final norm and
    the head last; comma-joined, one argument per stage."""
    parts, start = [], 0
    for i, n in enumerate(split):
        names = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(split) - 1:
            names += ["norm", "lm_head"]
        parts.append(",".join(names))
    return parts


def _check_expressible(layout) -> None:
    p = layout.plan
    if p.precision == "fp16":
        raise PlanError("precision", "torchtitan's mixed precision is bf16 or fp32 (mixed_precision_param); "
                        "plan with --precision bf16")
    if p.fp8_params:
        raise PlanError("fp8_params", "torchtitan 0.3's Float8 converter (rowwise) has no FP8 weight all-gather; "
                        "plan without --fp8-params")
    if p.reduce_dtype not in (None, "fp32"):
        raise PlanError("reduce_dtype", "torchtitan 0.3 reduces gradients in fp32 only "
                        "(training.mixed_precision_reduce); plan without --reduce-dtype")
    if p.optimizer not in OPTIMIZERS:
        raise PlanError("optimizer", f"torchtitan 0.3 builds Adam and AdamW (and DistMuon); not {p.optimizer}")
    if p.optimizer_state_dtype not in (None, "fp32", "bf16") or (
            p.optimizer_state_dtype == "bf16" and recipe(p).optimizer_impl != "fused"):
        raise PlanError("optimizer_state_dtype", "torchtitan keeps Adam's moments in bf16 only with its fused "
                        "optimizer (optimizer.implementation fused_opt_states_bf16)")
    if p.offload_optimizer != p.offload_params:
        raise PlanError("offload_optimizer" if p.offload_optimizer else "offload_params",
                        "torchtitan's enable_cpu_offload moves parameters, gradients and optimizer state to the "
                        "host together; plan with both --offload-optimizer and --offload-params, or neither")
    if layout.zero == 1:
        raise PlanError("zero", "FSDP has no ZeRO-1: it shards the optimizer state together with the gradients "
                        "(ZeRO-2, fsdp_reshard_after_forward never); plan with --zero 2")
    if layout.cp > 1 and p.cp_comm != "allgather":
        raise PlanError("cp_comm", "torchtitan 0.3 gathers the K/V shards (torch's allgather rotation; no option "
                        "for a ring); plan with --cp-comm allgather")
    if layout.pp > 1 and p.schedule not in SCHEDULES:
        raise PlanError("schedule", f"torchtitan has no {p.schedule} schedule; export one of {', '.join(SCHEDULES)}")
    if p.recompute == "selective" and p.recompute_modules:
        raise PlanError("recompute_modules", "torchtitan's selective checkpointing picks its own ops (SelectiveAC); "
                        "plan without --recompute-modules")
    if p.recompute == "full" and p.recompute_layers is not None:
        raise PlanError("recompute_layers", "torchtitan's full activation checkpointing wraps every block; plan "
                        "without --recompute-layers")


def torchtitan_argv(layout) -> list[str]:
    """The arguments after `-m torchtitan.train`: the config, then the plan's overrides."""
    p, m = layout.plan, layout.model
    _check_expressible(layout)
    cfg = torchtitan_config(m, p.precision)
    if layout.seq_len > cfg.max_seq_len:
        raise PlanError("seq_len", f"torchtitan's {cfg.config} builds its rotary table for {cfg.max_seq_len:,} "
                        f"positions (got {layout.seq_len:,})")
    # FSDP shards parameters, gradients and optimizer state (ZeRO-3), and with
    # fsdp_reshard_after_forward "never" keeps each layer gathered from its forward to its
    # backward (ZeRO-2, SHARD_GRAD_OP); without ZeRO the data parallel ranks replicate (DDP).
    # Hybrid sharding (HSDP) shards over dp_shard ranks and replicates across the groups.
    shard, replicate = (layout.dp_shard, layout.dp // layout.dp_shard) if layout.zero >= 2 else (1, layout.dp)
    # torchtitan: local_batch_size per data-parallel rank and accumulation step, split into
    # pipeline micro-batches with PP; global_batch_size / (local x data parallel) accumulation steps
    local = layout.mbs * (layout.micro_batches if layout.pp > 1 else 1)
    a = ["--module", cfg.module, "--config", cfg.config,
         "--training.local_batch_size", str(local), "--training.global_batch_size", str(layout.gbs),
         "--training.seq_len", str(layout.seq_len), "--training.max_norm", repr(float(p.grad_clip)),
         # pure 16-bit training: parameters (and so the optimizer) in bf16, no fp32 master copy
         "--training.dtype", "bfloat16" if p.precision != "fp32" and not p.master_weights else "float32",
         "--training.mixed_precision_param", "float32" if p.precision == "fp32" else "bfloat16",
         "--training.mixed_precision_reduce", "float32",
         "--training.enable-cpu-offload" if p.offload_optimizer else "--training.no-enable-cpu-offload",
         "--parallelism.data_parallel_replicate_degree", str(replicate),
         "--parallelism.data_parallel_shard_degree", str(shard),
         # "default" reshards after the forward without PP and keeps the stage gathered with it
         "--parallelism.fsdp_reshard_after_forward", "never" if layout.zero == 2 else "default",
         "--parallelism.tensor_parallel_degree", str(layout.tp),
         "--parallelism.enable-sequence-parallel" if layout.sp or layout.tp == 1
         else "--parallelism.no-enable-sequence-parallel",
         "--parallelism.context_parallel_degree", str(layout.cp),
         "--parallelism.expert_parallel_degree", str(layout.ep if m.is_moe else 1),
         "--parallelism.pipeline_parallel_degree", str(layout.pp)]
    if layout.pp > 1 or (m.is_moe and layout.ep > 1):
        # torchtitan captures the step in CUDA graphs unless told not to, and refuses that with
        # pipelining or its all-to-all expert dispatch (trainer.py _validate_cuda_graphs)
        a.append("--training.disable-cuda-graphs")
    if layout.pp > 1:
        a += ["--parallelism.pipeline_parallel_schedule", SCHEDULES[p.schedule],
              "--parallelism.pipeline_parallel_microbatch_size", str(layout.mbs)]
        a += virtual_stage_options(layout, layout.vpp if p.schedule in MULTI_STAGE else 1)
    if p.overlap_tp and layout.tp > 1:  # async TP is a compiler pass
        a += ["--compile.enable", "--compile.enable-async-tensor-parallel"]
    else:
        a += ["--compile.no-enable-async-tensor-parallel"]
    impl = recipe(p).optimizer_impl
    a += ["--optimizer.param-groups.0.optimizer-name", OPTIMIZERS[p.optimizer],
          "--optimizer.implementation", "fused_opt_states_bf16" if p.optimizer_state_dtype == "bf16" else impl]
    a.append({"none": "activation-checkpoint:none", "selective": "activation-checkpoint:selective",
              "full": "activation-checkpoint:full"}[p.recompute])
    return a


def notes(layout) -> list[str]:
    p = layout.plan
    cfg = torchtitan_config(layout.model, p.precision)
    out = [f"the learning rate, its schedule, the steps and the data are torchtitan's {cfg.config} config's: "
           "yours to choose (--optimizer.param-groups.0.optimizer-kwargs.lr, --lr-scheduler.*, --training.steps, "
           "--dataloader.*)"]
    if layout.zero >= 3 and p.backward_prefetch != "pre":
        out.append(f"backward prefetch {p.backward_prefetch}: FSDP2 always gathers the next layer's parameters "
                   "ahead in the backward; plan with --backward-prefetch pre to match")
    if p.recompute == "full" and p.dropout == 0 and not recipe(p).early_stop_checkpoint:
        out.append("torchtitan's activation checkpointing is non-reentrant and stops before each block's last "
                   "linear; plan with --recompute-early-stop to match")
    return out


def torchtitan_script(layout) -> str:
    argv = torchtitan_argv(layout)
    nodes = -(-layout.gpus // layout.plan.gpus_per_node)
    per_node = min(layout.gpus, layout.plan.gpus_per_node)
    head = ["#!/usr/bin/env bash",
            f"# torchtitan 0.3 run of {layout.model.name} on {layout.gpus} x {layout.gpu.name} (TP {layout.tp} "
            f"PP {layout.pp} DP {layout.dp} CP {layout.cp} EP {layout.ep}), generated by trainplan.",
            *(f"# {n}" for n in notes(layout)),
            ("# Run it on the node" if nodes == 1 else f"# Run it on each of the {nodes} nodes with torchrun's "
             "rendezvous options (--node-rank, --rdzv-endpoint)") + "; arguments after it override these.",
            "ARGS=("]
    lines = [  # --module X --config Y on the first line
        "  " + " ".join(shlex.quote(t) for t in argv[:4])]
    i = 4
    while i < len(argv):
        tok = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--") and ":" not in argv[i + 1]:
            lines.append(f"  {tok} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            lines.append(f"  {tok}")
            i += 1
    tail = [")", f'exec torchrun --nnodes {nodes} --nproc-per-node {per_node} -m torchtitan.train "${{ARGS[@]}}" "$@"']
    return "\n".join(head + lines + tail) + "\n"
