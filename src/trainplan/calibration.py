"""Published training runs against the time model (docs/accuracy.md, tests).

Each published row is turned into a plan with its published layout. Details a source does
not give are chosen by one rule for all rows, never fitted per row:

* micro-batch 1 unless published; the 1F1B schedule;
* recompute as published; where a source is silent (Megatron-Core): none, or selective if
  the plan does not fit in memory, then full;
* 2019-2021 Megatron runs: fp16, materialised attention (pre-FlashAttention), gradient
  all-reduce after the backward, the backward's tensor-parallel all-reduces synchronous (Megatron-LM
  made them asynchronous beside the weight-gradient GEMMs on 2021-09-02, commit 16c90445e7, after
  the April 2021 tables); 2024 Megatron-Core: bf16, cuDNN attention (Transformer
  Engine prefers it to FlashAttention-2 on Hopper: conventions.toml
  [efficiency.cudnn_attention_curve]), the published overlap flags, separate input and output
  embeddings (the published sizes count both); MosaicML: bf16 autocast
  (fp8 for their FP8 table: Transformer Engine linears) under FSDP1 FULL_SHARD (PyTorch 2.1's
  FullyShardedDataParallel, which divides each unsharded gradient in place before its
  reduce-scatter), Composer's DecoupledAdamW (a per-parameter loop of unfused ops, priced as
  torch.optim's for-loop AdamW), FlashAttention in
  Triton (their benchmark script's attn_impl default), flash-attn's fused cross-entropy (MPT's
  loss_fn default), learned position embeddings (the published parameter counts grow with
  the sequence length), gradients reduce-scattered in bf16 (the tables' FSDP mixed precision
  "DEFAULT" set no reduce_dtype before Composer PR #2628 of October 2023, and FSDP then
  reduces in the bf16 parameter dtype; the sharded gradients stay fp32; the large-scale table,
  run in January 2024 on Composer 0.17, where "DEFAULT" sets reduce_dtype float32, reduces in
  fp32: its table's reduce_dtype), activation
  checkpointing non-reentrant (the script sets activation_checkpointing_reentrant false;
  PyTorch 2.1's early stop then skips each block's down projection in the recomputation, the
  fsdp conventions' default), FSDP's backward prefetch BACKWARD_POST (Composer's default, which
  the yamls keep: each backward gather waits until the layer before has its gradients); the
  large-scale table's sweep script (llm-foundry scripts/train/benchmarking/sweep.py at 5e85bd62d)
  passes BACKWARD_PRE and, for four of its six models, FlashAttention-2, which the table itself
  does not state: its rows keep these rules (docs/accuracy.md gives the table priced both ways);
* Llama 3 405B: as published, no recompute, the interleaved schedule on the paper's split
  (one layer fewer on the first and last stages: 7, 8, ..., 8, 7) and ZeRO-2 (FSDP sharding
  optimizer states and gradients: the ZeRO paper's byte accounting, 16-bit gradients
  reduce-scattered in every micro-batch's backward, as a rank that keeps only its partition of
  the gradients must, with DeepSpeed's passes over them; the paper reduce-scatters in FP32
  (§3.3.4), which would put the 8K rows 21-22% too slow, and a once-a-step FP32 reduction of
  gradients accumulated whole would not fit in 80 GB); v = 8, one layer per
  virtual stage, as the paper's "the first model chunk on the first stage has only the
  embedding" implies; bf16, FlashAttention, SP with TP, FSDP's gradient and parameter
  collectives overlapped; TP collectives not (the paper describes no TP overlap; the plan's
  default); context parallelism all-gathers K/V before attention, "exposed in the critical
  path" (§3.3.2);
* NeMo AutoModel (H100, BF16): as each benchmark config sets it (the table's source), with the
  defaults of the code it runs through where the config is silent: FSDP2 through the MoE
  parallelizer (reshard_after_forward False: ZeRO-2; fp32 reduction) or FSDP2Manager (ZeRO-3;
  bf16 reduction), the model built in bf16 and trained without an fp32 master copy (the optimizer's
  state in bf16 for torch.optim, fp32 for Transformer Engine's FusedAdam), full activation
  checkpointing, the config's attention (Transformer
  Engine's, cuDNN on Hopper; or the Hugging Face model's SDPA), loss (MaskedCrossEntropy with or
  without its fp32 upcast: PyTorch's fp32 loss, or one that keeps the 16-bit logits) and optimizer
  step (Transformer Engine's FusedAdam: fused; torch.optim.Adam: foreach); context parallelism
  as PyTorch runs it by default, K/V all-gathered; experts routed evenly (the config's balanced
  gate);
* BLOOM (Megatron-DeepSpeed): as its slurm script sets it: bf16 with DeepSpeed's BF16 optimizer
  (ZeRO-1: fp32 master weights and Adam state sharded over data parallelism; the fp32 gradients
  all-reduced once a step, after the last backward, DeepSpeed's _bf16_reduce_grads), full
  recomputation, Megatron's fused kernels and materialised attention (2022, before
  FlashAttention), ALiBi (no position parameters), tied embeddings, the pipeline cut by
  'type:transformer|embedding' (the embedding and the tied head each count as a layer: 5 layers
  on the first and last stages, 6 on the others), DeepSpeed's pipeline engine (the `deepspeed`
  framework with 1F1B: estimate/pipeline_engine.py) and Jean Zay's 50 Gb/s per GPU between nodes;
* OPT-175B (metaseq): as its launcher sets it: fp16 parameters and gradients without an fp32
  copy (--memory-efficient-fp16: the optimizer keeps fp32 Adam state and upcasts as it steps),
  FSDP (fairscale's, the flat-parameter design PyTorch's FSDP1 took over: the `fsdp1`
  convention) with --no-reshard-after-forward (ZeRO-2) reducing in fp16, Megatron tensor
  parallelism 8 without sequence parallelism, full recomputation through Megatron's reentrant
  checkpoint, materialised attention (2022); ReLU priced as GELU (the same GEMMs); a vocabulary
  of 50,272, learned positions, tied embeddings. Its FLOP rate, whose count the paper does not
  give, is taken as Narayanan et al.'s 96-count (the FLOPs a run that recomputes every layer
  executes), and "up to" as the run's rate;
* DeepSpeed's ZeRO-3 runs on Azure (Megatron-DeepSpeed, 2022): as its recipes set them: ZeRO-3
  over every GPU, fp16, full recomputation (reentrant), Megatron's fused kernels and
  materialised attention, GPT-2's 50,257 tokens (Megatron pads them to 50,304: 0.1% more head
  FLOPs, not priced), learned positions, one
  micro-batch per step, DeepSpeed's CPU Adam where the recipe offloads the optimizer (the 2T
  run, whose recipe is not published, as the 1T one);
* torchtitan (December 2024, Llama 3.1 on H100): FSDP2 (ZeRO-3; torchtitan's default
  mixed_precision_reduce float32), bf16 or, for its Float8 rows, fp8 linears (torchao's
  Float8Linear, priced as the fp8 convention); PyTorch's SDPA (FlashAttention-2 on H100) and
  fp32 cross-entropy; torch.optim.AdamW without --optimizer.fused (foreach), max_norm 1.0;
  selective per-op checkpointing priced as such (selective-op); torch.compile as fused
  kernels (which the time model does not price; the rows with and without it are predicted
  alike); sequence parallelism with TP, AsyncTP as overlapped TP collectives; context
  parallelism all-gathering K/V (its default rotate method); every row priced on the
  catalog's H100-SXM-96GB (the runs' part: 2.4 TB/s of HBM2e, as the benchmark states) at the
  700 W SXM's peak FLOP/s: the clocks a 500 W limit sustains are published nowhere.

Each source is compared on the figure it measured (throughput per GPU, or iteration time),
counted its way: FLOP rates with the source's own FLOP formula (Narayanan et al.'s 96-count,
Megatron-LM's num_floating_point_operations, PaLM's 6N + 12·L·H·Q·T for Llama 3), never ours.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np

from .estimate.flops import step_flops
from .estimate.memory import estimate_memory
from .estimate.recipe import recipe
from .estimate.time import step_time
from .plan import make_plan, resolve
from .profile import load_profile
from .specs import catalog
from .specs.model import ModelSpec


def _gpt(name, hidden, heads, layers, vocab, seq, mlp="gelu", tied=True) -> ModelSpec:
    return ModelSpec(name=name, source="published run", layers=layers, hidden=hidden, heads=heads,
                     ffn=4 * hidden, mlp=mlp, vocab=vocab, tied_embeddings=tied, norm="layernorm",
                     position="learned", max_position=seq, qkv_bias=True, bias=True, fused_qkv=True)


def evaluate_layout(layout, r=None):
    """Whether a resolved layout fits and its step (`r`: a recipe other than the plan's own)."""
    mem = estimate_memory(layout, r)
    profile = load_profile(layout.plan.gpu_profile) if layout.plan.gpu_profile else None
    return {"fits": bool(np.max(mem["total"]) <= layout.gpu.capacity_bytes),
            "time": step_time(layout, profile, mem, r)}


def bloom_engine_comparison(cfg: dict) -> tuple[dict, dict]:
    """The BLOOM row (`cfg`: its published_runs.toml table) timed under DeepSpeed's pipeline
    engine, as it ran, and under Megatron's schedules with everything else the same (the plan's
    recipe with Megatron's engine): the two step-time dicts (estimate/pipeline_engine.py)."""
    spec, kw = bloom_setup(cfg, cfg["rows"][0])
    layout = resolve(make_plan(**kw), spec)
    megatron_engine = replace(recipe(layout.plan), pipeline_engine="megatron")
    return evaluate_layout(layout)["time"], evaluate_layout(layout, megatron_engine)["time"]


def _with_recompute_rule(spec, profiles=None, **kw):
    """recompute none, else selective, else full: the first that fits."""
    for rc in ("none", "selective", "full"):
        layout = resolve(_plan(profiles or {}, recompute=rc, **kw), spec)
        out = evaluate_layout(layout)
        if out["fits"] or rc == "full":
            return layout, out, rc
    raise AssertionError


def _plan(profiles: dict[str, str], **kw):
    """A plan for a published row, with the calibrated profile of its accelerator if one is given."""
    gpu = kw.get("gpu")
    return make_plan(**kw, **({"gpu_profile": profiles[gpu]} if gpu in profiles else {}))


def rows(path: str | Path, profiles: dict[str, str] | None = None, attention: str = "triton") -> list[dict]:
    """Every published row against its prediction; `profiles` maps an accelerator name to a
    calibrated profile (`trainplan bench --profile`) used instead of its catalog defaults;
    `attention` the kernel the MosaicML rows run (their published Triton one by default)."""
    data = tomllib.loads(Path(path).read_text())
    return [_compare(table, cfg, row, profiles or {}, attention) for table, cfg in data.items() for row in cfg["rows"]]


# tables that are selections of another table's rows: counted once, in the whole table
SELECTIONS = ("mosaicml_h100", "mosaicml_a100")
# tables a training ratio is fitted on (conventions.toml [efficiency]); every other one is held out
FITTED = ("narayanan2021", "megatron_core_h100")
# tables run on a part the catalog only approximates (torchtitan's H100s, H100-SXM-96GB: 96 GB of
# HBM2e at 2.4 TB/s and a 500 W power limit, at the SXM's peak FLOP/s, which no source gives for
# that limit): shown in docs/accuracy.md, not counted in the error `plan` reports
OTHER_PARTS = ("torchtitan_h100",)


def errors_by_gpu(data: list[dict]) -> dict:
    """Each accelerator's published runs (selections counted once) against their predictions,
    as docs/accuracy.md counts them (predicted / published - 1 on the figure each source
    measured; tables run on another part of it, OTHER_PARTS, left out): {gpu: {runs, fitted_runs,
    moe_runs, mean_abs_error, worst_abs_error}}, `fitted_runs`
    those of a table a training ratio was fitted on, `moe_runs` those of mixture-of-experts models."""
    out = {}
    for gpu in sorted({r["gpu"] for r in data}):
        mine = [r for r in data if r["gpu"] == gpu and r["source"] not in SELECTIONS + OTHER_PARTS]
        if not mine:
            continue
        e = np.abs([r["predicted"] / r["published"] - 1 for r in mine])
        out[catalog.gpu(gpu).name] = {"runs": int(e.size), "fitted_runs": sum(r["source"] in FITTED for r in mine),
                                      "moe_runs": sum(bool(r.get("moe")) for r in mine),
                                      "mean_abs_error": round(float(e.mean()), 4),
                                      "worst_abs_error": round(float(e.max()), 4)}
    return out


def readme_accuracy_summary(data: list[dict]) -> str:
    """The README's account of docs/accuracy.md: each table's mean absolute error (written by
    scripts/accuracy_report.py between README.md's accuracy-summary markers; a test keeps it current)."""
    def mean(source):
        e = [abs(r["predicted"] / r["published"] - 1) for r in data if r["source"] == source]
        return f"{np.mean(e):.1%}"

    runs = lambda source: sum(r["source"] == source for r in data)  # noqa: E731
    return (f"(A100: {mean('narayanan2021')} mean error on Narayanan et al. 2021 Table 1,\n"
            f"{mean('megatron_single_node')} on the held-out Megatron v1/v2 table and {mean('mosaicml_a100_full')} on "
            f"MosaicML's whole held-out A100 table of\n{runs('mosaicml_a100_full')} runs; H100 not yet within target: "
            f"{mean('megatron_core_h100')} on the Megatron-Core table Hopper's GEMM ratio is\nfitted on, "
            f"{mean('llama3_405b')} on the held-out Llama 3 405B runs, {mean('mosaicml_h100_full')} on MosaicML's whole "
            f"BF16 table of {runs('mosaicml_h100_full')}\nruns, {mean('mosaicml_h100_large')} on its large-scale table "
            f"(128-512 GPUs), {mean('mosaicml_h100_fp8')} on its FP8 table and {mean('automodel_h100')} on\n"
            f"NeMo AutoModel's FSDP2 runs, a mixture of experts among them).")


def megatron_model_flops(model: ModelSpec, *, tokens: int, seq: int, vocab_padded: int) -> float:
    """Model FLOPs as Megatron-LM reports them (megatron/training/training.py,
    num_floating_point_operations): 12·B·s·L·h²·((1 + g/a + s/h)·q/h + f/h·k·(3/2 if gated)
    + V/(2Lh)), i.e. every matmul's backward twice its forward and the attention scores over
    the whole sequence (no causal halving): our count with the materialised-attention
    backward (tests/test_time.py checks the closed form)."""
    return float(step_flops(model, tokens=tokens, seq=seq, dense_layers=model.layers - model.n_moe_layers,
                            moe_layers=model.n_moe_layers, head=1, attention_eager=True, recompute=0,
                            vocab_padded=vocab_padded)["model"])


def palm_model_flops(model: ModelSpec, *, tokens: int, seq: int) -> float:
    """Model FLOPs as PaLM (Chowdhery et al. 2022, App. B) and Llama 3's MFU count them:
    6·N + 12·L·H·Q·T per token, N every parameter, T the sequence length."""
    return float(tokens * (6 * model.params + 12 * model.layers * model.q_dim * seq))


# plan options that make up a layout; the rest of a published row's options set the problem
LAYOUT_OPTIONS = ("tp", "pp", "cp", "ep", "zero", "sp", "mbs", "recompute", "schedule", "vpp", "stage_layers")


def narayanan_setup(cfg: dict, row: list) -> tuple[ModelSpec, dict]:
    """A Narayanan et al. Table 1 row: the model and the plan options of its published layout."""
    pb, a, h, L, tp, pp, g, gbs, _ = row
    return _gpt(f"GPT {pb}B", h, a, L, 51200, 2048), dict(
        gpu=cfg["gpu"], gpus=g, tp=tp, pp=pp, gbs=gbs, mbs=1, seq_len=2048, recompute="full", framework="megatron",
        attention="eager", precision="fp16", overlap_dp=False, tp_backward_overlap=False)


def mosaicml_setup(cfg: dict, row: list, attention: str = "triton") -> tuple[ModelSpec, dict]:
    """A MosaicML llm-foundry row: the MPT model and the plan options of its run (the rule in
    the docstring); `attention` replaces the published kernel for a comparison."""
    name, d, a, L, seq, g, mb, ga, gbs, ckpt, tok, mfu = row[:12]
    # FSDP's sharding strategy, where a table gives one: SHARD_GRAD_OP keeps the parameters
    # gathered from the forward through the backward and shards gradients and optimizer state
    # (ZeRO-2); FULL_SHARD (the default) shards the parameters too (ZeRO-3)
    zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[row[12] if len(row) > 12 else "FULL_SHARD"]
    spec = ModelSpec(name=f"MPT-{name}", source="llm-foundry", layers=L, hidden=d, heads=a, ffn=4 * d,
                     mlp="gelu", vocab=50368, tied_embeddings=True, norm="layernorm", position="learned",
                     max_position=seq, fused_qkv=True)
    return spec, dict(gpu=cfg["gpu"], gpus=g, zero=zero, framework="fsdp1", optimizer_impl="for-loop",
                      precision=cfg.get("precision", "bf16"), mbs=mb, gbs=gbs, seq_len=seq, attention=attention,
                      fused_loss=True, reduce_dtype=cfg.get("reduce_dtype", "bf16"), backward_prefetch="post",
                      recompute="full" if ckpt else "none")


def llama3_setup(cfg: dict, row: list) -> dict:
    """A Llama 3 405B row: the plan options of its published layout (the rule in the docstring)."""
    g, tp, cp, pp, _, seq, _ = row
    return dict(model="llama-3.1-405b", gpu=cfg["gpu"], gpus=g, tp=tp, cp=cp, pp=pp,
                gbs=cfg["tokens_per_batch"] // seq, mbs=1, seq_len=seq, zero=2, sp=True, recompute="none",
                schedule="interleaved", vpp=8, framework="deepspeed", attention="flash", precision="bf16",
                overlap_tp=False, overlap_dp=True, cp_comm="allgather")


def automodel_setup(cfg: dict, row: list) -> dict:
    """A NeMo AutoModel row: the plan options of its benchmark config (the rule in the docstring)."""
    _, model, g, gbs, mbs, seq, tp, pp, cp, ep, zero, reduce, attention, fp32_loss, impl, state = row[:16]
    return dict(model=model, gpu=cfg["gpu"], gpus=g, tp=tp, pp=pp, cp=cp, ep=ep, gbs=gbs, mbs=mbs, seq_len=seq,
                zero=zero, framework="fsdp", reduce_dtype=reduce, recompute="full", attention=attention,
                fused_loss=not fp32_loss, optimizer_impl=impl, cp_comm="allgather", precision="bf16",
                master_weights=cfg["master_weights"], optimizer_state_dtype=state)


def bloom_setup(cfg: dict, row: list) -> tuple[ModelSpec, dict]:
    """The BLOOM 176B row: the model and the plan options of its run (the rule in the docstring)."""
    _, g, tp, pp, _, mbs, gbs, seq = row[:8]
    spec = ModelSpec(name="BLOOM 176B", source="published run", layers=70, hidden=14336, heads=112,
                     ffn=4 * 14336, mlp="gelu", vocab=250880, tied_embeddings=True, norm="layernorm",
                     position="none", max_position=seq, qkv_bias=True, bias=True, fused_qkv=True)
    # 'type:transformer|embedding': 72 partitioned layers, 6 a stage, the embedding on the first
    # and the tied head on the last taking one slot each
    split = [5] + [6] * (pp - 2) + [5]
    return spec, dict(gpu=cfg["gpu"], gpus=g, tp=tp, pp=pp, gbs=gbs, mbs=mbs, seq_len=seq, zero=1,
                      recompute="full", framework="deepspeed", schedule="1f1b", stage_layers=split,
                      attention="eager", precision="bf16", fused_kernels=True, reduce_dtype="fp32",
                      nic_gbps=cfg["nic_gbps"])


def opt_setup(cfg: dict, row: list) -> tuple[ModelSpec, dict]:
    """The OPT-175B row: the model and the plan options of its run (the rule in the docstring)."""
    _, g, tp, _, mbs, gbs, seq = row[:7]
    spec = _gpt("OPT-175B", 12288, 96, 96, 50272, seq)
    return spec, dict(gpu=cfg["gpu"], gpus=g, tp=tp, gbs=gbs, mbs=mbs, seq_len=seq, zero=2, framework="fsdp1",
                      precision="fp16", master_weights=False, optimizer_state_dtype="fp32", reduce_dtype="fp16",
                      recompute="full", recompute_early_stop=False, attention="eager")


def azure_zero3_setup(cfg: dict, row: list) -> tuple[ModelSpec, dict]:
    """A DeepSpeed ZeRO-3 row on Azure: the model and the plan options of its run (the rule in
    the docstring)."""
    label, L, h, a, g, mbs, seq, offload = row[:8]
    spec = _gpt(label, h, a, L, 50257, seq)
    return spec, dict(gpu=cfg["gpu"], gpus=g, tp=1, pp=1, zero=3, mbs=mbs, gbs=mbs * g, seq_len=seq,
                      recompute="full", framework="deepspeed", attention="eager", precision="fp16",
                      fused_kernels=True, offload_optimizer=offload)


def torchtitan_setup(cfg: dict, row: list) -> dict:
    """A torchtitan row: the plan options of its run (the rule in the docstring)."""
    _, _, model, g, tp, cp, local, gbs, seq, rc, compiled, float8, async_tp = row[:13]
    # torchtitan's "selective" mode is per-op selective checkpointing unless a layer period is given
    rc = "selective-op" if rc == "selective" else rc
    return dict(model=model, gpu=cfg["gpu"], gpus=g, tp=tp, cp=cp, mbs=local, gbs=gbs, seq_len=seq, zero=3,
                sp=tp > 1, framework="fsdp", reduce_dtype="fp32", recompute=rc, attention="flash",
                precision="fp8" if float8 else "bf16", optimizer_impl="foreach", grad_clip=1.0,
                fused_kernels=compiled, overlap_tp=async_tp, cp_comm="allgather")


def torchtitan_peaks(cfg: dict) -> list[dict]:
    """The torchtitan rows' published peak memory (the last column, GiB: torchtitan logs the
    caching allocator's peak reserved bytes) against the planned peak of the same run. The
    runs' H100s had 96 GB; the planned peak does not depend on the capacity."""
    out = []
    for row in cfg["rows"]:
        layout = resolve(make_plan(**torchtitan_setup(cfg, row)))
        peak = float(np.max(estimate_memory(layout)["total"])) / 2**30
        out.append(dict(table=row[0], label=f"Table {row[0]}: {row[2]}, {row[1]}, {row[3]} GPUs, s {row[8]:,}",
                        recompute=layout.plan.recompute, float8=bool(row[11]), compiled=bool(row[10]),
                        published=float(row[-1]), predicted=peak))
    return out


def _compare(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str = "triton") -> dict:
    """One published row against its prediction (`attention`: the kernel MosaicML rows run,
    their published Triton one unless a comparison asks for another)."""
    compare = _COMPARISONS.get("mosaicml" if table.startswith("mosaicml_") else table)
    if compare is None:
        raise ValueError(table)
    return compare(table, cfg, row, profiles, attention)


def _compare_narayanan2021(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """Narayanan et al. 2021, Table 1: TFLOP/s per GPU by their 96-count formula."""
    pb, a, h, L, tp, pp, g, gbs, pub = row
    spec, kw = narayanan_setup(cfg, row)
    layout = resolve(_plan(profiles, **kw), spec)
    t = evaluate_layout(layout)["time"]
    s, V = 2048, 51200
    flops = 96 * gbs * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    pred = flops / t["step_s"] / g / 1e12
    label = f"GPT {pb}B, TP {tp} PP {pp} DP {layout.dp}, {g} GPUs"
    return dict(source=table, gpu=cfg["gpu"], label=label, metric="TFLOP/s per GPU (96-count)", published=pub,
                predicted=pred)


def _compare_megatron_core_h100(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """Megatron-Core's H100 weak-scaling table: model TFLOP/s per GPU, recomputation by its rule."""
    pb, a, h, L, tp, pp, g, gbs, pub = row
    s, V = 4096, 131072
    # separate input and output embeddings: the published sizes count both (1.7B is
    # 1.49B tied, 1.75B untied; 7.1B 6.60 / 7.13; 462B 459.1 / 461.5)
    spec = _gpt(f"GPT {pb}B", h, a, L, V, s, tied=False)
    layout, out, rc = _with_recompute_rule(
        spec, profiles, gpu=cfg["gpu"], gpus=g, tp=tp, pp=pp, gbs=gbs, mbs=1, seq_len=s, zero=1, sp=tp > 1,
        framework="megatron", attention="cudnn", precision="bf16", overlap_tp=True, overlap_dp=True)
    flops = megatron_model_flops(spec, tokens=gbs * s, seq=s, vocab_padded=layout.vocab_padded)
    pred = flops / out["time"]["step_s"] / g / 1e12
    label = f"GPT {pb}B, TP {tp} PP {pp} DP {layout.dp}, recompute {rc}"
    return dict(source=table, gpu=cfg["gpu"], label=label, metric="TFLOP/s per GPU (model)", published=pub,
                predicted=pred)


def _compare_megatron_single_node(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """Megatron-LM v1/v2's GPT-2 scaling table (tensor parallelism only): iteration milliseconds."""
    h, a, L, mp, g, system, gbs, ms, tf = row
    spec = _gpt(f"GPT h{h}", h, a, L, 50257, 1024)
    gpu = "V100" if system == "V100" else "A100-40GB-SXM"
    layout = resolve(_plan(profiles, gpu=gpu, gpus=g, tp=mp, gbs=gbs, mbs=gbs // (g // mp), seq_len=1024,
                               recompute="full", framework="megatron", attention="eager", precision="fp16",
                               overlap_dp=False, tp_backward_overlap=False, gpus_per_node=16 if system == "V100" else 8), spec)
    t = evaluate_layout(layout)["time"]
    label = f"{system}: h {h}, {L} layers, MP {mp}, {g} GPUs"
    return dict(source=table, gpu=gpu, label=label, metric="iteration ms", published=ms, predicted=t["step_s"] * 1e3)


def _compare_mosaicml(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """MosaicML's LLM Foundry throughput tables: tokens/s per GPU."""
    name, d, a, L, seq, g, mb, ga, gbs, ckpt, tok, mfu = row[:12]
    spec, kw = mosaicml_setup(cfg, row, attention=attention)
    layout = resolve(_plan(profiles, **kw), spec)
    t = evaluate_layout(layout)["time"]
    label = (f"MPT-{name}, s {seq}, {g} GPUs, mb {mb}{', act ckpt' if ckpt else ''}"
             + (", SHARD_GRAD_OP" if kw["zero"] == 2 else ""))
    return dict(source=table, gpu=cfg["gpu"], label=label, metric="tokens/s per GPU", published=tok,
                predicted=t["tokens_per_s"] / g)


def _compare_llama3_405b(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """Llama 3 405B (Table 4): model TFLOP/s per GPU."""
    g, tp, cp, pp, dp, seq, pub = row
    layout = resolve(_plan(profiles, **llama3_setup(cfg, row)))
    assert layout.dp == dp
    flops = palm_model_flops(layout.model, tokens=layout.gbs * seq, seq=seq)
    pred = flops / evaluate_layout(layout)["time"]["step_s"] / g / 1e12
    label = f"Llama 3 405B, TP {tp} CP {cp} PP {pp} DP {dp}, {g:,} GPUs, s {seq:,}"
    return dict(source=table, gpu=cfg["gpu"], label=label, metric="TFLOP/s per GPU (model)", published=pub,
                predicted=pred)


def _compare_automodel_h100(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """NeMo AutoModel's H100 runs: tokens/s per GPU."""
    label, *_, step_s, tok = row
    layout = resolve(_plan(profiles, **automodel_setup(cfg, row)))
    t = evaluate_layout(layout)["time"]
    par = ", ".join(f"{k.upper()} {getattr(layout, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(layout, k) > 1)
    return dict(source=table, gpu=cfg["gpu"], label=f"{label}, {layout.gpus} GPUs, FSDP {layout.dp}"
                + (f", {par}" if par else ""), metric="tokens/s per GPU", published=tok,
                predicted=t["tokens_per_s"] / layout.gpus, moe=layout.model.is_moe)


def _compare_bloom_176b(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """BLOOM 176B: iteration seconds."""
    label, g, tp, pp, dp = row[:5]
    spec, kw = bloom_setup(cfg, row)
    layout = resolve(_plan(profiles, **kw), spec)
    assert layout.dp == dp
    t = evaluate_layout(layout)["time"]
    return dict(source=table, gpu=cfg["gpu"], label=f"{label}, TP {tp} PP {pp} DP {dp}, {g} GPUs",
                metric="iteration s", published=row[8], predicted=t["step_s"])


def _compare_opt_175b(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """OPT-175B: TFLOP/s per GPU by the 96-count formula."""
    label, g, tp, dp = row[:4]
    spec, kw = opt_setup(cfg, row)
    layout = resolve(_plan(profiles, **kw), spec)
    assert layout.dp == dp
    t = evaluate_layout(layout)["time"]
    s, h, L, V = layout.seq_len, spec.hidden, spec.layers, spec.vocab
    flops = 96 * layout.gbs * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return dict(source=table, gpu=cfg["gpu"], label=f"{label}, TP {tp} FSDP (ZeRO-2) {dp}, {g} GPUs",
                metric="TFLOP/s per GPU (96-count)", published=row[7], predicted=flops / t["step_s"] / g / 1e12)


def _compare_deepspeed_azure_zero3(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """DeepSpeed ZeRO-3 on Azure: TFLOP/s per GPU by the 96-count formula."""
    label, g = row[0], row[4]
    spec, kw = azure_zero3_setup(cfg, row)
    layout = resolve(_plan(profiles, **kw), spec)
    t = evaluate_layout(layout)["time"]
    s, h, L, V = layout.seq_len, spec.hidden, spec.layers, layout.vocab_padded
    flops = 96 * layout.gbs * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    return dict(source=table, gpu=cfg["gpu"], label=f"{label}, ZeRO-3 {g}, mb {kw['mbs']}, s {s}"
                + (", optimizer on the CPU" if kw["offload_optimizer"] else ""),
                metric="TFLOP/s per GPU (96-count)", published=row[8], predicted=flops / t["step_s"] / g / 1e12)


def _compare_torchtitan_h100(table: str, cfg: dict, row: list, profiles: dict[str, str], attention: str) -> dict:
    """torchtitan's Llama 3.1 runs: tokens/s per GPU."""
    tab, label, _, g = row[:4]
    layout = resolve(_plan(profiles, **torchtitan_setup(cfg, row)))
    t = evaluate_layout(layout)["time"]
    name = layout.model.name
    return dict(source=table, gpu=cfg["gpu"], label=f"Table {tab}: {name}, {label}, {g} GPUs, s {layout.seq_len:,}",
                metric="tokens/s per GPU", published=row[13], predicted=t["tokens_per_s"] / g)


# each table's comparison, by table name (every MosaicML table one)
_COMPARISONS = {
    "narayanan2021": _compare_narayanan2021,
    "megatron_core_h100": _compare_megatron_core_h100,
    "megatron_single_node": _compare_megatron_single_node,
    "mosaicml": _compare_mosaicml,
    "llama3_405b": _compare_llama3_405b,
    "automodel_h100": _compare_automodel_h100,
    "bloom_176b": _compare_bloom_176b,
    "opt_175b": _compare_opt_175b,
    "deepspeed_azure_zero3": _compare_deepspeed_azure_zero3,
    "torchtitan_h100": _compare_torchtitan_h100,
}
