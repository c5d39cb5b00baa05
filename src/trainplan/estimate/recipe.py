"""Bytes per parameter and per activation element for a plan's precision, optimizer and
framework: the numbers `memory` multiplies by. Values come from catalog/conventions.toml."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from ..plan import DTYPE_BYTES, Plan, conventions
from .memo import Memo, cached_hash
from .scalars import bools, values


@dataclass(frozen=True)
class Recipe:
    weight_bytes: float  # persistent weights per trainable parameter (full fine-tuning)
    compute_weight_bytes: float  # the dtype weights are gathered/cast to for compute
    grad_bytes: float
    reduce_bytes: float  # per gradient element in the data-parallel reduce-scatter / all-reduce
    master_bytes: float
    optimizer_bytes: float  # optimizer state per trainable parameter (elementwise part)
    state_bytes: float  # bytes per optimizer state element (fp32: 4), for the factored part too
    factored_optimizer: bool  # Adafactor: add 4 bytes x (rows + cols) per matrix
    act_bytes: float  # activation element
    residual_bytes: float  # residual stream and norm inputs (fp32 under torch.autocast)
    linear_in_bytes: float  # activation saved as a GEMM input (fp8 keeps these in 1 byte)
    fused_kernels: bool
    frozen_weight_bytes: float  # base weights under LoRA / QLoRA
    autocast_copy_bytes: float  # 16-bit weight casts autocast saves for backward (plain torch)
    reduce_bucket_elems: float
    # data-parallel collectives issued unit by unit (FSDP: each layer and the root), each call
    # paying NCCL's latency; ZeRO-3 does so under any framework
    per_unit_collectives: bool
    grad_bucket_copy: bool
    logit_bytes: float  # logits the loss keeps for its backward (fp32 log-probabilities, or 16-bit)
    loss_workspace_bytes: float  # per logit, transient during the loss
    loss_traffic_bytes: float  # HBM bytes per logit the loss's forward moves
    loss_backward_bytes: float  # ... and its backward
    tp_embedding_grad_replicated: bool = False
    # under sequence parallelism the linears reading a block's all-gathered input keep the
    # gathered tensor (DTensor), not the sequence shard (Megatron re-gathers it in backward)
    sp_gathers_saved_inputs: bool = False
    # under context parallelism (torch's ring attention) the output projection keeps a copy of
    # the attention output, not a view of it (conventions.toml `cp_ring_output_copy`)
    cp_ring_output_copy: bool = False
    # Full recomputation checkpoints non-reentrantly with early stop (PyTorch >= 2.1): a
    # recomputed block stops after its last saved tensor. Without dropout after the block's last
    # linear (a dropout saves its mask after it, so the recomputation would have to run it)...
    early_stop_checkpoint: bool = False
    # ... that is before the last linear (flops.py: a dense block's MLP down projection, an MoE
    # block's ungated shared experts' one), unless LoRA adapts it: the adapter's x·A, kept for
    # B's gradient, is computed after the frozen base's GEMM
    recompute_skips_last_linear: bool = False
    # the optimizer step's HBM traffic relative to one fused kernel (conventions.toml
    # [optimizer_step]): foreach and for-loop steps run one pass per operation
    optimizer_impl: str = "fused"
    optimizer_traffic: float = 1.0
    # ... and of the optimizer's step on the host under --offload-optimizer ([offload])
    cpu_optimizer_impl: str = "fused"
    cpu_optimizer_traffic: float = 1.0
    # LoRA with dropout on each adapter's input (PEFT's lora_dropout > 0): A's gradient needs the
    # dropped copy (with its mask), not the input the frozen base shares
    lora_dropout: bool = False
    # LoRA's fp32 adapters under autocast beside a 16-bit base: peft casts each adapter's input to
    # the adapter's dtype (peft lora/layer.py Linear.forward, _cast_input_dtype) and autocast casts
    # it back for lora_A, so every adapter keeps its own 16-bit copy of its input (measured with
    # peft 0.21 in validate, peft_lora.py), not the input the frozen base shares
    lora_input_copies: bool = False
    # one-way passes (a read or a write) over the local gradients, in the reduce dtype, that
    # the framework makes outside the collective each time it reduces them (scaling, NaN
    # check, zeroing, copies into a communication buffer), and over each gathered parameter,
    # in the compute dtype, per gather (FSDP2 copies the gathered output out)
    grad_reduce_passes: float = 0.0
    grad_reduce_passes_zero3: float = 0.0  # ... where the framework runs ZeRO-3 otherwise (DeepSpeed)
    gather_copy_passes: float = 0.0
    # one-way passes over the optimizer's gradients (its shard) that gradient-norm clipping
    # makes each step: the norm reads them, the scaling reads and writes them
    grad_clip_passes: float = 0.0
    # ZeRO-2/3 under pipeline parallelism keeps the stage's parameters gathered and accumulates
    # its gradients unsharded through the step, reducing once at the last micro-batch (FSDP2
    # driven by PyTorch's pipeline schedules, torchtitan)
    pp_accumulates_unsharded: bool = False
    # the ZeRO stage from which gradients are kept sharded (2; Megatron keeps its whole
    # contiguous gradient buffer until ZeRO-3: conventions.toml grads_sharded_from_zero)
    grads_sharded_from_zero: int = 2
    # FSDP keeps every parameter sharded between uses from ZeRO-2 on (its fp32 shard is the
    # master copy); ZeRO-2 (SHARD_GRAD_OP) keeps the compute-dtype copy it gathers for a unit's
    # forward until that unit's backward
    shards_params_at_rest: bool = False
    # FSDP1 falls back to NO_SHARD (ZeRO-0) when its shard group is a single rank
    single_rank_no_shard: bool = False
    # MoE experts apply the gate weights inside their activation (before the down projection), so
    # the gate-weight gradient needs no kept expert output (Megatron-Core; conventions.toml)
    moe_gate_in_activation: bool = False
    # the engine that runs its pipeline stages (conventions.toml [pipeline_engines]; applied by
    # estimate/pipeline_engine.py where that engine has the plan's schedule)
    pipeline_engine: str = "megatron"
    # ZeRO-3 gathers submodule by submodule (DeepSpeed's fetch_sub_module), not one call per
    # wrapped unit (FSDP); parameters gathered for a recomputed forward are kept for the backward
    # only when reused within this many elements (DeepSpeed stage3_max_reuse_distance; FSDP
    # recomputes inside the unit's backward, after its gather: never gathered again)
    zero3_module_fetches: bool = False
    # ... and, within a submodule, parameter by parameter (DeepSpeed v0.3.13-v0.5.5), its gathers
    # waiting for the device to drain first: beside no compute (`zero3_gathers_overlap` false)
    zero3_parameter_calls: bool = False
    zero3_gathers_overlap: bool = True
    zero3_max_reuse_distance: float = float("inf")
    # tensor-parallel collectives of the backward issued asynchronously beside the GEMMs they do
    # not feed (Megatron's column-parallel linears: the input gradient's all-reduce, or under SP
    # its reduce-scatter, beside the weight-gradient GEMM; under SP the input's re-gather beside
    # the input-gradient GEMM): conventions.toml [frameworks] tp_backward_overlap
    tp_backward_overlap: bool = False

    @property
    def casts_linear_inputs(self) -> bool:
        """torch.autocast over an fp32 residual stream: every linear casts its fp32 input to
        16 bits itself (autocast caches weights' casts only), so linears that share an input
        each keep their own copy, and RoPE's fp32 tables promote q and k."""
        return self.autocast_copy_bytes > 0 and self.residual_bytes > self.act_bytes

    def keeps_stage_gathered(self, pp, zero):
        """Where ZeRO-2/3 runs as pipelined FSDP (`pp_accumulates_unsharded` and more than one
        stage): the stage stays gathered and its gradients unsharded, reduced once a step."""
        return bools(self.pp_accumulates_unsharded & (values(pp) > 1) & (values(zero) >= 2))

    def weights_sharded(self, zero):
        """Where the persistent weights are sharded over data parallelism: ZeRO-3, and ZeRO-2
        under FSDP (`shards_params_at_rest`)."""
        return bools(values(zero) >= (2 if self.shards_params_at_rest else 3))

    def keeps_gathered_forward_to_backward(self, zero):
        """Where each unit's gathered compute-dtype copy lives from its forward to its backward
        (FSDP's SHARD_GRAD_OP): at the start of the backward the whole stage is gathered."""
        return bools(self.shards_params_at_rest & (values(zero) == 2))

    def __hash__(self) -> int:
        return cached_hash(self)

    def describe(self) -> str:
        return (f"weights {self.weight_bytes:g} B + grads {self.grad_bytes:g} B + master "
                f"{self.master_bytes:g} B + optimizer {self.optimizer_bytes:g} B per parameter")


# the plan's fields `recipe` reads (tests/test_bounds.py checks the list against its source)
RECIPE_FIELDS = ("dropout", "finetune", "fp8_params", "framework", "fused_kernels", "fused_loss", "grad_clip",
                 "grad_dtype", "lora_dropout", "lora_targets", "master_weights", "optimizer", "optimizer_impl",
                 "optimizer_state_dtype", "precision", "qlora_bits", "recompute_early_stop", "reduce_dtype",
                 "tp_backward_overlap")
_RECIPES = Memo(256)


def recipe(plan: Plan) -> Recipe:
    """Bytes per parameter and element, and the framework's conventions, for a plan's recipe
    (one object per distinct recipe: memoised on the fields it reads)."""
    key = tuple(tuple(v) if isinstance(v, list) else v for v in _recipe_fields(plan))
    return _RECIPES.get(key, lambda: _recipe(plan))


_recipe_fields = attrgetter(*RECIPE_FIELDS)


def _recipe(plan: Plan) -> Recipe:
    conv = conventions()
    fw = conv["frameworks"][plan.framework]
    b = _bytes_per_param(plan, conv, fw)
    weight, grad, master, act, compute_w = b["weight"], b["grad"], b["master"], b["act"], b["compute_w"]
    mixed = plan.precision != "fp32"
    pure16 = mixed and not plan.master_weights
    autocast = 2.0 if (mixed and not pure16 and fw.get("autocast_weight_copy", False)) else 0.0
    # Under autocast the parameters and the residual stream stay fp32: norms run in fp32
    # (they are on autocast's fp32 list) and only matmul inputs are cast to 16 bits. A LoRA
    # base frozen in 16 bits keeps a 16-bit stream (its embedding's output; norms cast back to
    # their input's dtype): only the fp32 adapters' weights are cast.
    residual = 4.0 if autocast and plan.finetune == "full" else act
    logit, workspace, traffic, backward = _loss_bytes(plan, conv, fw, act)
    impl = plan.optimizer_impl or fw["optimizer_impl"]
    early_stop = bool(fw["recompute_early_stop"] if plan.recompute_early_stop is None
                      else plan.recompute_early_stop) and plan.dropout == 0
    return Recipe(
        weight_bytes=weight, compute_weight_bytes=compute_w, grad_bytes=grad, master_bytes=master,
        reduce_bytes=float(DTYPE_BYTES[plan.reduce_dtype]) if plan.reduce_dtype
        else compute_w if fw.get("reduce_in_compute_dtype", False) else grad,
        optimizer_bytes=b["opt"], state_bytes=float(b["state"]), factored_optimizer=plan.optimizer == "adafactor",
        act_bytes=act, residual_bytes=residual,
        linear_in_bytes=b["linear_in"], frozen_weight_bytes=b["frozen"],
        fused_kernels=bool(fw["fused_kernels"] if plan.fused_kernels is None else plan.fused_kernels),
        autocast_copy_bytes=autocast, reduce_bucket_elems=float(fw["reduce_bucket_elems"]),
        per_unit_collectives=bool(fw.get("per_unit_collectives", False)),
        zero3_module_fetches=bool(fw.get("zero3_module_fetches", False)),
        zero3_parameter_calls=bool(fw.get("zero3_parameter_calls", False)),
        zero3_gathers_overlap=bool(fw.get("zero3_gathers_overlap", True)),
        zero3_max_reuse_distance=float(fw.get("zero3_max_reuse_distance", float("inf"))),
        grad_bucket_copy=bool(fw["grad_bucket_copy"]),
        tp_embedding_grad_replicated=bool(fw.get("tp_embedding_grad_replicated", False)),
        sp_gathers_saved_inputs=bool(fw.get("sp_gathers_saved_inputs", False)),
        cp_ring_output_copy=bool(fw.get("cp_ring_output_copy", False)),
        early_stop_checkpoint=early_stop,
        recompute_skips_last_linear=early_stop and not (plan.finetune != "full" and "down" in plan.lora_targets),
        logit_bytes=logit, loss_workspace_bytes=workspace, loss_traffic_bytes=traffic,
        loss_backward_bytes=backward,
        optimizer_impl=impl, optimizer_traffic=float(conv["optimizer_step"][impl]),
        cpu_optimizer_impl=fw["cpu_optimizer_impl"],
        lora_dropout=plan.finetune != "full" and plan.lora_dropout > 0,
        lora_input_copies=plan.finetune != "full" and autocast > 0,
        cpu_optimizer_traffic=float(conv["optimizer_step"][fw["cpu_optimizer_impl"]]),
        grad_reduce_passes=float(fw["grad_reduce_passes"]),
        grad_reduce_passes_zero3=float(fw.get("grad_reduce_passes_zero3", fw["grad_reduce_passes"])),
        gather_copy_passes=float(fw["gather_copy_passes"]),
        grad_clip_passes=float(fw["grad_clip_passes"]) if plan.grad_clip > 0 else 0.0,
        pp_accumulates_unsharded=bool(fw.get("pp_accumulates_unsharded", False)),
        grads_sharded_from_zero=int(fw.get("grads_sharded_from_zero", 2)),
        moe_gate_in_activation=bool(fw.get("moe_gate_in_activation", False)),
        shards_params_at_rest=bool(fw.get("shards_params_at_rest", False)),
        single_rank_no_shard=bool(fw.get("single_rank_no_shard", False)),
        pipeline_engine=str(fw.get("pipeline_engine", "megatron")),
        tp_backward_overlap=bool(fw.get("tp_backward_overlap", False) if plan.tp_backward_overlap is None
                                 else plan.tp_backward_overlap),
    )


def _bytes_per_param(plan: Plan, conv: dict, fw: dict) -> dict:
    """The recipe's bytes per parameter (weights, the compute copy, gradients, master copy,
    optimizer state and its dtype, a QLoRA base's) and per activation element (`_recipe`)."""
    opt = float(conv["optimizers"][plan.optimizer])
    mixed = plan.precision != "fp32"
    # pure 16-bit training: the weights and gradients stay in the compute dtype, no fp32 copy
    pure16 = mixed and not plan.master_weights
    if pure16:
        weight, grad, master, act, compute_w = 2.0, 2.0, 0.0, 2.0, 2.0
    elif mixed:
        weight = float(fw["weight_bytes"])
        grad = float(fw.get(f"grad_bytes_{plan.precision}", fw["grad_bytes"]))
        master = float(fw["master_bytes"])
        act = 2.0
        compute_w = 2.0
    else:
        weight, grad, master, act, compute_w = 4.0, 4.0, 0.0, 4.0, 4.0
    # the optimizer state's dtype: fp32 (the [optimizers] figures), the weights' own under pure
    # 16-bit training (torch.optim's zeros_like), or as set
    fp32 = float(DTYPE_BYTES["fp32"])
    state = (DTYPE_BYTES[plan.optimizer_state_dtype] if plan.optimizer_state_dtype
             else weight if pure16 else fp32)
    if plan.optimizer in conv["optimizers"]["state_dtype_follows"]:
        opt *= state / fp32
    else:
        state = fp32
    if plan.grad_dtype is not None:
        grad = float(DTYPE_BYTES[plan.grad_dtype])
    linear_in = act
    if plan.precision == "fp8":
        cache = float(conv["fp8"]["weight_cache_bytes"])
        linear_in = float(conv["fp8"]["linear_input_bytes"])
        if plan.fp8_params:
            # the compute weights are FP8 tensors: a 16-bit copy beside the fp32 master becomes
            # an FP8 one, only the transpose is cached, and gathers move FP8 ([fp8] source)
            held16 = master > 0 and weight == compute_w
            weight = (float(conv["fp8"]["param_bytes"]) if held16 else weight) + cache - float(
                conv["fp8"]["param_bytes"])
            compute_w = float(conv["fp8"]["param_bytes"])
        else:
            weight += cache
    if plan.finetune == "qlora":
        key = "nf4_bits" if plan.qlora_bits == 4 else "int8_bits"
        frozen = float(conv["quantized_base"][key]) / 8
    else:
        frozen = compute_w
    return {"weight": weight, "grad": grad, "master": master, "act": act, "compute_w": compute_w, "opt": opt,
            "state": state, "linear_in": linear_in, "frozen": frozen}


def _loss_bytes(plan: Plan, conv: dict, fw: dict, act: float) -> tuple:
    """The loss's bytes per logit: those it keeps, its workspace, and what its forward and its
    backward move (`_recipe`)."""
    # The loss (conventions.toml [runtime]): PyTorch's cross-entropy works on an fp32 copy of
    # the logits and keeps the fp32 log-probabilities; a fused kernel keeps the 16-bit logits and
    # writes a 16-bit gradient, its only workspace.
    run = conv["runtime"]
    if plan.fused_loss:
        logit, workspace, traffic = act, act, act * run["fused_loss_forward_passes"]
    else:
        logit, workspace, traffic = 4.0, float(run["loss_workspace_bytes"]), 4.0 * run["loss_forward_passes"]
    backward = 2 * traffic
    if not plan.fused_loss and "loss_forward_bytes" in fw:  # the framework's own loss kernels
        traffic, backward = float(fw["loss_forward_bytes"]), float(fw["loss_backward_bytes"])
    return logit, workspace, traffic, backward
