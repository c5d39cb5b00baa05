"""Exports checked by the frameworks' own code (the `frameworks` extra: DeepSpeed 0.19,
torchtitan 0.3, Megatron Core 0.16). Each test builds the framework's configuration objects
from an export and lets them validate, then checks that they describe the planned run:
the same model, layout, batch, precision and optimizer. A test is skipped only when its
framework cannot be imported."""

import argparse
import json
import re
from pathlib import Path

import pytest

from trainplan.errors import PlanError
from trainplan.export import CONVENTIONS, export_layout
from trainplan.plan import make_plan, resolve
from trainplan.specs import catalog

DATA = Path(__file__).parent / "data"


def planned(target, **kw):
    return resolve(make_plan(**kw, framework=CONVENTIONS[target]))


# ---------------------------------------------------------------- Megatron-LM / Megatron Core

MEGATRON_PLANS = [
    # Llama 3.1 405B on PP 16: 126 layers as 7 + 14 x 8 + 7 (--decoder-first/last-pipeline-num-layers)
    dict(model="llama-3.1-405b", gpus=16384, tp=8, pp=16, gbs=2048, seq_len=8192),
    # DeepSeek-V3 on PP 8: 61 layers as 7, 8 x 5, 7, 7 (--pipeline-model-parallel-layout), MLA,
    # one shared expert, three dense layers first, sigmoid routing with groups
    dict(model="deepseek-v3", gpus=2048, pp=8, ep=64, gbs=4096, seq_len=4096),
    dict(model="mixtral-8x7b", gpus=32, tp=2, ep=8, zero=1, gbs=64, recompute="full"),
    dict(model="qwen1.5-moe-a2.7b", gpus=8, ep=4, zero=1, gbs=32),
    dict(model="qwen3-30b-a3b", gpus=16, ep=8, zero=1, gbs=32, sp=True, tp=2),
    dict(model="gpt2-xl", gpus=8, precision="fp16", attention="eager", gbs=64, seq_len=1024),
    dict(model="llama-3-70b", gpus=64, tp=8, pp=4, sp=True, schedule="interleaved", vpp=2, gbs=256,
         recompute="selective"),
    dict(model="qwen2.5-7b", gpus=16, cp=2, gbs=32, seq_len=32768, precision="fp8", fp8_params=True, zero=1),
    dict(model="llama-3-8b", gpus=32, zero=3, gbs=64),
    # GLM-4-9B: RoPE on half of each head, on adjacent pairs, base 5,000,000; StableLM 2: a quarter
    dict(model="glm-4-9b", gpus=8, tp=2, gbs=32),
    dict(model="stablelm-2-1.6b", gpus=8, gbs=32),
]


def _megatron_table():
    return json.loads((DATA / "megatron_flags.json").read_text())


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's parser as the generated table records it (names, destinations, types,
    choices, arity, defaults), at the commit the table names."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    by_dest: dict = {}
    for name, row in _megatron_table()["flags"].items():
        by_dest.setdefault(json.dumps(row, sort_keys=True), (row, []))[1].append(name)
    for row, names in by_dest.values():
        kw = {"dest": row["dest"]}
        if "default" in row:
            kw["default"] = row["default"]
        if row["type"] == "flag":
            kw.update(action="store_const", const=row.get("const"))
        else:
            kw["type"] = {"int": int, "float": float}.get(row["type"], str)
            if "choices" in row:  # enum choices are written as Enum.member: the member's name is typed
                kw["choices"] = [c.split(".", 1)[1] if isinstance(c, str) and row["type"] == "enum_type_handler"
                                 else c for c in row["choices"]]
            if "nargs" in row:
                kw["nargs"] = row["nargs"]
        parser.add_argument(*names, **kw)
    return parser


def parse_megatron(text: str) -> argparse.Namespace:
    """What `pretrain_gpt.py $(cat megatron_args.txt)` sees: the file split on whitespace."""
    assert "#" not in text and "\\" not in text and "'" not in text and '"' not in text, text
    return megatron_parser().parse_args(text.split())


def megatron_transformer_config(ns):
    """Megatron Core's TransformerConfig (MLATransformerConfig with --multi-latent-attention)
    built from the parsed flags as Megatron-LM's core_transformer_config_from_args does
    (megatron/training/arguments.py at the table's commit): fields taken by name, then its
    renames. Its __post_init__ validates the model and layout."""
    pytest.importorskip("megatron.core", reason="Megatron Core is not installed (the frameworks extra)")
    import dataclasses

    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if ns.multi_latent_attention else TransformerConfig
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
    # validate_args: the parameters' dtype from --bf16 / --fp16
    dtype = torch.bfloat16 if ns.bf16 else torch.float16 if ns.fp16 else torch.float32
    kw.update(params_dtype=dtype, pipeline_dtype=dtype, num_moe_experts=ns.num_experts,
              num_layers_in_first_pipeline_stage=ns.decoder_first_pipeline_num_layers,
              num_layers_in_last_pipeline_stage=ns.decoder_last_pipeline_num_layers,
              num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
              persist_layer_norm=not ns.no_persist_layer_norm, batch_p2p_comm=not ns.overlap_p2p_comm,
              virtual_pipeline_model_parallel_size=ns.num_virtual_stages_per_pipeline_rank,
              fp8_param=ns.fp8_param_gather)
    if isinstance(ns.moe_layer_freq, str):  # moe_freq_type: an int, or a Python list expression
        kw["moe_layer_freq"] = eval(ns.moe_layer_freq, {"__builtins__": {}}) if "[" in ns.moe_layer_freq \
            else int(ns.moe_layer_freq)
    if ns.swiglu:
        kw.update(activation_func=F.silu, gated_linear_unit=True, bias_activation_fusion=ns.bias_swiglu_fusion)
    else:
        kw["bias_activation_fusion"] = ns.bias_gelu_fusion
    if ns.rope_type is None:
        kw.pop("rope_type", None)
    if len(ns.cp_comm_type) == 1:
        kw["cp_comm_type"] = ns.cp_comm_type[0]
    for name in ("attention_backend",):  # enums the parser converts by name
        kw.pop(name, None)
    # fused kernels come from Transformer Engine, which a CPU test machine lacks: they change no
    # shape, layout or dtype, so they are switched off for the check
    for name in ("apply_rope_fusion", "bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm",
                 "gradient_accumulation_fusion", "bias_dropout_fusion", "cross_entropy_loss_fusion"):
        if name in kw:
            kw[name] = False
    kw = {k: v for k, v in kw.items() if not (isinstance(v, str) and k in ("init_method", "output_layer_init_method"))}
    return cls(**kw)


def megatron_stage_layers(cfg) -> list[int]:
    """Decoder layers per pipeline rank, by Megatron Core's own rules (the layout, or
    transformer_block.get_num_layers_to_build for even and first/last splits)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vpp = cfg.pipeline_model_parallel_size, cfg.virtual_pipeline_model_parallel_size or 1
    if cfg.pipeline_model_parallel_layout is not None:
        layout = cfg.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage] -> layer types
        return [sum(chunk.count(LayerType.decoder) for chunk in layout[r]) for r in range(pp)]
    return [sum(get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=r) for v in range(vpp))
            for r in range(pp)]


@pytest.mark.parametrize("kw", MEGATRON_PLANS, ids=lambda kw: kw["model"])
def test_megatron_core_builds_the_planned_model_and_layout(kw):
    lay = planned("megatron", **kw)
    ns = parse_megatron(export_layout(lay, "megatron").text)
    cfg = megatron_transformer_config(ns)
    m = lay.model
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads) == (m.layers, m.hidden, m.heads)
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size,
            cfg.sequence_parallel) == (lay.tp, lay.pp, lay.cp, lay.sp)
    assert megatron_stage_layers(cfg) == list(lay.stage_layers)
    assert (ns.micro_batch_size, ns.global_batch_size, ns.seq_length) == (lay.mbs, lay.gbs, lay.seq_len)
    assert cfg.gated_linear_unit == (m.mlp == "swiglu")
    assert cfg.normalization == ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    if m.norm_eps is not None:
        assert cfg.layernorm_epsilon == m.norm_eps
    assert ns.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    # Megatron's QKV projection has a bias with either flag (attention.py linear_qkv)
    assert cfg.add_bias_linear == m.bias and (cfg.add_bias_linear or cfg.add_qkv_bias) == (m.qkv_bias or m.bias)
    assert cfg.qk_layernorm == m.qk_norm
    if m.position == "rotary":  # Llama 3: 500,000, not Megatron's default 10,000
        assert ns.position_embedding_type == "rope" and ns.rotary_base == m.rope_theta
        assert ns.rotary_percent == m.rotary_fraction and cfg.rotary_interleaved == m.rope_interleaved
        s = m.rope_scaling
        if s is not None and s.kind == "llama3":
            assert ns.use_rope_scaling and ns.rope_scaling_factor == s.factor
        if s is not None and s.kind == "yarn":
            assert (cfg.rope_type, cfg.rotary_scaling_factor, cfg.mscale, cfg.mscale_all_dim) == (
                "yarn", s.factor, s.mscale, s.mscale_all_dim)
            assert (cfg.original_max_position_embeddings, cfg.beta_fast, cfg.beta_slow) == (
                s.original_max_position, s.beta_fast, s.beta_slow)
    else:
        assert ns.position_embedding_type == "learned_absolute"
    if m.is_mla:
        assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.qk_pos_emb_head_dim, cfg.v_head_dim) == (
            m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)
    else:
        assert (cfg.num_query_groups or cfg.num_attention_heads) == m.n_kv_heads
    if m.is_moe:
        assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size, cfg.expert_model_parallel_size) \
            == (m.experts, m.top_k, m.expert_ffn, lay.ep)
        freq = cfg.moe_layer_freq
        moe_layers = sum(freq) if isinstance(freq, list) else len(range(0, m.layers, freq))
        assert moe_layers == sum(lay.stage_moe_layers)
        assert (cfg.moe_shared_expert_intermediate_size or 0) == m.shared_experts * (
            m.shared_expert_ffn or m.expert_ffn or 0)
        assert cfg.moe_shared_expert_gate == m.shared_expert_gate
        assert cfg.moe_router_score_function == m.router_score
        assert cfg.moe_router_pre_softmax == (not m.router_norm_topk and m.router_score == "softmax")
        assert cfg.moe_router_enable_expert_bias == m.router_bias
        assert (cfg.moe_router_topk_scaling_factor or 1.0) == m.router_scale
        assert (cfg.moe_router_num_groups, cfg.moe_router_group_topk) == (m.router_groups, m.router_group_topk)
    p = lay.plan
    assert cfg.bf16 == (p.precision in ("bf16", "fp8")) and cfg.fp16 == (p.precision == "fp16")
    assert cfg.fp8 == ("hybrid" if p.precision == "fp8" else None) and cfg.fp8_param == p.fp8_params
    assert cfg.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    assert ns.use_distributed_optimizer == (lay.zero >= 1)
    assert ns.data_parallel_sharding_strategy == {0: "no_shard", 1: "no_shard", 2: "optim_grads",
                                                  3: "optim_grads_params"}[lay.zero]


def test_megatron_args_file_has_no_comment_and_reads_whole_from_cat():
    """`$(cat megatron_args.txt)` splits on whitespace and keeps `#` and backslashes as words:
    the file holds flags only, one per line; the notes travel separately."""
    e = export_layout(planned("megatron", model="llama-3.1-8b", gpus=8, attention="triton"), "megatron")
    assert all(line.startswith("--") for line in e.text.splitlines())
    assert any("attention triton" in n for n in e.notes) and any("--lr" in n for n in e.notes)
    ns = parse_megatron(e.text)
    assert ns.lr is None and ns.train_iters is None  # no invented learning rate or length


def test_megatron_flag_table_names_its_commit():
    table = _megatron_table()
    assert re.fullmatch(r"[0-9a-f]{40}", table["commit"]) and table["commit"] in table["source"]
    flags = table["flags"]
    assert flags["--rotary-base"]["type"] == "int" and flags["--optimizer"]["choices"][:2] == ["adam", "sgd"]
    assert len(flags) > 600  # the whole parser, not a hand-picked list


@pytest.mark.parametrize("kw, field", [
    (dict(model="llama-3-8b", gpus=8, optimizer="adafactor"), "optimizer"),
    (dict(model="llama-3-8b", gpus=8, optimizer="lion"), "optimizer"),
    (dict(model="llama-3-8b", gpus=16, pp=2, schedule="zb", gbs=64), "schedule"),
    (dict(model="gpt-neox-20b", gpus=8), "model.parallel_residual"),
    (dict(model="llama-3-8b", gpus=8, offload_optimizer=True, offload_params=True, zero=3), "offload_params"),
    (dict(model="llama-3-8b", gpus=8, precision="fp8", fp8_params=True, zero=0), "fp8_params"),
])
def test_megatron_refuses_what_it_cannot_express(kw, field):
    with pytest.raises(PlanError) as err:
        export_layout(planned("megatron", **kw), "megatron")
    assert err.value.field == field and "Megatron-LM cannot express" in str(err.value)


# ---------------------------------------------------------------- DeepSpeed

class MPU:
    """The model-parallel unit DeepSpeed asks for its data-parallel size (as Megatron-DeepSpeed
    passes one): the ranks left after tensor, pipeline and context parallelism."""

    def __init__(self, lay):
        self.lay = lay

    def get_data_parallel_world_size(self):
        return self.lay.dp

    def get_model_parallel_world_size(self):
        return self.lay.tp

    def get_tensor_model_parallel_world_size(self):
        return self.lay.tp

    def get_pipeline_model_parallel_world_size(self):
        return self.lay.pp


def deepspeed_config(lay, monkeypatch):
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (the frameworks extra)")
    import deepspeed.runtime.config as ds_config

    # DeepSpeedConfig asks torch.distributed for this rank first and, unset, falls back to one
    # rank without consulting the mpu: rank 0 of a job whose data-parallel size the mpu gives
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    text = export_layout(lay, "deepspeed").text
    return json.loads(text), ds_config.DeepSpeedConfig(json.loads(text), mpu=MPU(lay))


DEEPSPEED_PLANS = [
    dict(model="llama-3-70b", gpus=64, tp=8, zero=1, optimizer="adafactor", gbs=512),
    dict(model="llama-3-8b", gpus=32, zero=3, gbs=64, offload_optimizer=True),
    dict(model="mixtral-8x7b", gpus=16, ep=8, zero=2, gbs=64, recompute="full"),
    dict(model="gpt2-xl", gpus=8, precision="fp16", gbs=64, seq_len=1024, optimizer="sgd-momentum", zero=1),
    dict(model="qwen2.5-14b", gpus=16, zero=2, optimizer="lion", gbs=64, reduce_dtype="bf16"),
    dict(model="llama-3-8b", gpus=8, zero=0, optimizer="adam", precision="fp32", gbs=32),
]


@pytest.mark.parametrize("kw", DEEPSPEED_PLANS, ids=lambda kw: f"{kw['model']}-{kw.get('optimizer', 'adamw')}")
def test_deepspeed_config_classes_accept_the_planned_run(kw, monkeypatch):
    lay = planned("deepspeed", **kw)
    raw, cfg = deepspeed_config(lay, monkeypatch)
    # DeepSpeed's batch check: train_batch_size = micro x accumulation x data parallel
    assert cfg.world_size == lay.dp
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        lay.gbs, lay.mbs, lay.micro_batches)
    assert cfg.zero_optimization_stage == lay.zero
    assert cfg.bfloat16_config.enabled == (lay.plan.precision == "bf16")
    assert cfg.float16_config.enabled == (lay.plan.precision == "fp16")
    assert cfg.tensor_parallel_config.autotp_size == (lay.tp if lay.tp > 1 else 0)
    # the optimizer DeepSpeed builds: one of its own, or torch.optim's class of that name
    # (engine._configure_basic_optimizer)
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    name = cfg.optimizer_name
    assert name in DEEPSPEED_OPTIMIZERS or hasattr(torch.optim, name), name
    assert {"adamw": "adamw", "adam": "adam", "lion": "lion", "adafactor": "Adafactor",
            "sgd-momentum": "SGD"}[lay.plan.optimizer] == name
    assert "lr" not in cfg.optimizer_params and "lr" in raw["_set_before_launch"]  # no invented learning rate
    if lay.plan.optimizer == "adam":
        assert cfg.optimizer_params["adam_w_mode"] is False  # Adam, not DeepSpeed's default AdamW
    if name in ("SGD", "Adafactor") and lay.zero:
        assert cfg.zero_allow_untested_optimizer
    if lay.plan.offload_optimizer:
        assert cfg.zero_config.offload_optimizer.device == "cpu"
    if lay.plan.reduce_dtype:
        assert cfg.communication_data_type == torch.bfloat16
    if lay.model.is_moe and lay.ep > 1:
        from deepspeed.module_inject.auto_ep_config import validate_autoep_config

        assert cfg.expert_parallel_config.autoep_size == lay.ep
        validate_autoep_config(cfg.expert_parallel_config, lay.gpus, 1, max(lay.tp, 1), 1, zero_stage=lay.zero)


def test_deepspeed_refuses_the_published_failure_by_name():
    """Llama 3 70B on 64 GPUs with TP 8, PP 4 and Adafactor used to be written with TP and PP
    dropped (DeepSpeed: 1024 != 1*512*64). The pipeline stages live in the model code's
    PipelineModule, so the export refuses them; with TP 8 alone it validates (above)."""
    lay = planned("deepspeed", model="llama-3-70b", gpus=64, tp=8, pp=4, zero=1, optimizer="adafactor", gbs=128)
    with pytest.raises(PlanError) as err:
        export_layout(lay, "deepspeed")
    assert err.value.field == "pp"


@pytest.mark.parametrize("kw, field", [
    (dict(model="llama-3-8b", gpus=8, precision="fp8"), "precision"),
    (dict(model="llama-3-8b", gpus=8, optimizer="adam-8bit"), "optimizer"),
    (dict(model="llama-3-8b", gpus=16, tp=2, sp=True), "sp"),
    (dict(model="llama-3-8b", gpus=16, cp=2, seq_len=16384, gbs=16), "cp"),
    (dict(model="llama-3-8b", gpus=8, recompute="selective"), "recompute"),
    (dict(model="llama-3-8b", gpus=32, zero=3, dp_shard=8, gbs=64), "dp_shard"),  # MiCS left DeepSpeed in 0.19
])
def test_deepspeed_refuses_what_its_json_cannot_express(kw, field):
    with pytest.raises(PlanError) as err:
        export_layout(planned("deepspeed", **kw), "deepspeed")
    assert err.value.field == field


# ---------------------------------------------------------------- torchtitan

def torchtitan_job(lay):
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (the frameworks extra)")
    from torchtitan.config.manager import ConfigManager

    from trainplan.export.torchtitan import torchtitan_argv

    return ConfigManager().parse_args(torchtitan_argv(lay))


def torchtitan_stage_layers(job, pp: int) -> list[int]:
    """Transformer blocks per pipeline rank, by torchtitan's own split
    (distributed/pipeline_parallel.py) of the model its config builds."""
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
        _get_pp_rank_to_stage_indices_mapping,
    )

    par = job.parallelism
    world = par.data_parallel_replicate_degree * par.data_parallel_shard_degree * par.tensor_parallel_degree \
        * par.pipeline_parallel_degree * par.context_parallel_degree
    dims = ParallelDims.from_config(par, world)
    parts = par.module_fqns_per_model_part  # pipeline_llm takes the modules named, else cuts its own
    if parts is None:
        stages, layers, first, last = _get_pipeline_metadata(dims, par, job.model_spec.model)
        parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
    stages = len(parts)
    per_stage = [sum(name.startswith("layers.") for name in part) for part in parts]
    return [sum(per_stage[s] for s in _get_pp_rank_to_stage_indices_mapping(r, pp, par.pipeline_parallel_schedule,
                                                                             stages)) for r in range(pp)]


TORCHTITAN_PLANS = [
    # the problem's example: 8 x llama 3 8B, ZeRO-3, GBS 64: 8 accumulation steps of 1, not one pass of 8
    dict(model="llama-3.1-8b", gpus=8, zero=3, gbs=64),
    dict(model="llama-3.1-70b", gpus=64, tp=8, sp=True, pp=4, schedule="interleaved", vpp=2, gbs=256, zero=3),
    dict(model="llama-3.1-8b", gpus=32, zero=3, dp_shard=8, gbs=64, recompute="full"),
    dict(model="llama-3.1-8b", gpus=16, zero=2, cp=2, cp_comm="allgather", seq_len=16384, gbs=16,
         recompute="selective"),
    dict(model="qwen3-30b-a3b", gpus=16, ep=8, zero=3, gbs=32),
    dict(model="llama-3.1-8b", gpus=16, pp=2, gbs=64, zero=0),
    # 32 layers on 3 stages as 11, 11, 10: named module by module
    dict(model="llama-3.1-8b", gpus=24, pp=3, gbs=48, zero=0, schedule="gpipe"),
]


@pytest.mark.parametrize("kw", TORCHTITAN_PLANS, ids=lambda kw: f"{kw['model']}-{kw['gpus']}")
def test_torchtitan_job_config_is_the_planned_run(kw):
    lay = planned("torchtitan", **kw)
    job = torchtitan_job(lay)
    t, par = job.training, job.parallelism
    # batch: global / (local x data parallel) accumulation steps; with PP the local batch is cut
    # into pipeline micro-batches
    assert t.global_batch_size == lay.gbs and t.seq_len == lay.seq_len
    accumulation = lay.gbs // (t.local_batch_size * lay.dp)
    if lay.pp == 1:
        assert (t.local_batch_size, accumulation) == (lay.mbs, lay.micro_batches)
    else:
        assert (par.pipeline_parallel_microbatch_size, t.local_batch_size // par.pipeline_parallel_microbatch_size,
                accumulation) == (lay.mbs, lay.micro_batches, 1)
        assert torchtitan_stage_layers(job, lay.pp) == list(lay.stage_layers)
    assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == lay.dp
    from torchtitan.distributed.parallel_dims import ParallelDims

    ParallelDims.from_config(par, lay.gpus)  # its check: the degrees multiply to the world size
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (lay.tp, lay.pp, lay.cp, lay.ep)
    assert par.enable_sequence_parallel == (lay.sp or lay.tp == 1)
    assert par.fsdp_reshard_after_forward == ("never" if lay.zero == 2 else "default")
    assert par.data_parallel_shard_degree == (lay.dp_shard if lay.zero >= 2 else 1)
    assert t.mixed_precision_param == "bfloat16" and t.mixed_precision_reduce == "float32"
    ac = type(job.activation_checkpoint).__qualname__ if job.activation_checkpoint is not None else None
    assert ac == {"none": None, "selective": "SelectiveAC.Config", "full": "FullAC.Config"}[lay.plan.recompute]
    assert job.optimizer.param_groups[0].optimizer_name == "AdamW"
    m, built = lay.model, job.model_spec.model
    assert (built.dim, len(built.layers), built.vocab_size) == (m.hidden, m.layers, m.vocab)


def _torchtitan_model_fields(job) -> dict:
    """The ModelSpec fields of the model a torchtitan config builds (its model config tree)."""
    model = job.model_spec.model
    block = model.layers[-1]
    att = block.attention
    rope = att.rope
    out = {"layers": len(model.layers), "hidden": model.dim, "vocab": model.vocab_size,
           "tied_embeddings": bool(getattr(model, "enable_weight_tying", False)), "norm_eps": model.norm.eps,
           "rope_theta": float(rope.theta), "heads": att.n_heads if hasattr(att, "n_heads") else att.qkv_linear.n_heads}
    out["rope_scaling"] = {"none": None, "llama": "llama3", "yarn": "yarn"}[rope.scaling]
    if rope.scaling == "llama":
        out["rope_factor"] = (rope.scaling_factor, rope.low_freq_factor, rope.high_freq_factor,
                              rope.original_max_position_embeddings)
    if rope.scaling == "yarn":
        out["rope_factor"] = (rope.rope_factor, rope.beta_fast, rope.beta_slow, rope.original_seq_len)
    if hasattr(att, "kv_lora_rank"):
        out.update(q_lora_rank=att.q_lora_rank, kv_lora_rank=att.kv_lora_rank, qk_nope_head_dim=att.qk_nope_head_dim,
                   qk_rope_head_dim=att.qk_rope_head_dim, v_head_dim=att.v_head_dim)
    else:
        qkv = att.qkv_linear
        out.update(kv_heads=qkv.n_kv_heads, head_dim=qkv.head_dim, qk_norm=att.qk_norm is not None)
    moe = getattr(block, "moe", None)
    if moe is not None:
        r = moe.router
        out.update(experts=moe.num_experts, top_k=r.top_k, expert_ffn=moe.routed_experts.inner_experts.hidden_dim,
                   router_score=r.score_func, router_norm_topk=r.route_norm, router_scale=r.route_scale,
                   router_groups=r.num_expert_groups, router_group_topk=r.num_limited_groups,
                   shared_ffn=moe.shared_experts.w1.out_features if moe.shared_experts is not None else 0,
                   dense_first=sum(getattr(b, "moe", None) is None for b in model.layers))
    else:
        out["ffn"] = block.feed_forward.w1.out_features
    return out


def _spec_fields(spec, differs) -> dict:
    d = spec.model_copy(update=differs)
    s = d.rope_scaling
    out = {"layers": d.layers, "hidden": d.hidden, "vocab": d.vocab, "tied_embeddings": d.tied_embeddings,
           "norm_eps": d.norm_eps, "rope_theta": d.rope_theta, "heads": d.heads,
           "rope_scaling": s.kind if s else None}
    if s is not None and s.kind == "llama3":
        out["rope_factor"] = (s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position)
    if s is not None and s.kind == "yarn":
        out["rope_factor"] = (s.factor, s.beta_fast, s.beta_slow, s.original_max_position)
    if d.is_mla:
        out.update(q_lora_rank=d.q_lora_rank, kv_lora_rank=d.kv_lora_rank, qk_nope_head_dim=d.qk_nope_head_dim,
                   qk_rope_head_dim=d.qk_rope_head_dim, v_head_dim=d.v_head_dim)
    else:
        out.update(kv_heads=d.n_kv_heads, head_dim=d.dim_head, qk_norm=d.qk_norm)
    if d.is_moe:
        out.update(experts=d.experts, top_k=d.top_k, expert_ffn=d.expert_ffn, router_score=d.router_score,
                   router_norm_topk=d.router_norm_topk, router_scale=d.router_scale, router_groups=d.router_groups,
                   router_group_topk=d.router_group_topk,
                   shared_ffn=d.shared_experts * (d.shared_expert_ffn or d.expert_ffn) if d.shared_experts else 0,
                   dense_first=d.first_dense_layers)
    else:
        out["ffn"] = d.ffn
    return out


def test_torchtitan_configs_build_the_catalog_models_they_are_exported_for():
    """TORCHTITAN_CONFIGS says which catalog model each torchtitan config builds (and where it
    differs): checked against the model config tree torchtitan itself builds."""
    pytest.importorskip("torchtitan", reason="torchtitan is not installed (the frameworks extra)")
    import importlib

    from trainplan.export.torchtitan import TORCHTITAN_CONFIGS

    checked = []
    for c in TORCHTITAN_CONFIGS:
        registry = importlib.import_module(f"torchtitan.models.{c.module}.config_registry")
        try:
            job = getattr(registry, c.config)()
        except ImportError as exc:  # llama3_405b's Float8 converter needs torchao
            assert c.precision == "fp8", (c.config, exc)
            continue
        assert _torchtitan_model_fields(job) == _spec_fields(catalog.model(c.model), c.differs), c.config
        rope = job.model_spec.model.layers[0].attention.rope
        assert rope.max_seq_len == c.max_seq_len
        checked.append(c.config)
    assert len(checked) >= 4, checked


@pytest.mark.parametrize("kw, field", [
    (dict(model="llama-3-8b", gpus=8), "model"),  # torchtitan's 8B is Llama 3.1 (scaled RoPE)
    (dict(model="mixtral-8x7b", gpus=8), "model"),
    (dict(model="deepseek-v3", gpus=512, ep=64, pp=8, gbs=512), "model"),  # its norm eps is 1e-5, not 1e-6
    (dict(model="llama-3.1-8b", gpus=8, reduce_dtype="bf16"), "reduce_dtype"),
    (dict(model="llama-3.1-8b", gpus=8, precision="fp16"), "precision"),
    (dict(model="llama-3.1-8b", gpus=16, cp=2, seq_len=16384, gbs=16), "cp_comm"),
    (dict(model="llama-3.1-8b", gpus=8, optimizer="adafactor"), "optimizer"),
    (dict(model="llama-3.1-8b", gpus=8, zero=3, offload_optimizer=True), "offload_optimizer"),
])
def test_torchtitan_refuses_what_it_cannot_express(kw, field):
    with pytest.raises(PlanError) as err:
        export_layout(planned("torchtitan", **kw), "torchtitan")
    assert err.value.field == field


# ---------------------------------------------------------------- every catalog model

# What each target cannot express of the catalog's models (the rest export and validate):
# Megatron's GPT model has no parallel residual; torchtitan 0.3 builds only its own configs'
# models (TORCHTITAN_CONFIGS); a DeepSpeed config carries no model (the script's does).
TORCHTITAN_MODELS = {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-30b-a3b"}
REFUSED = {"megatron": {"gpt-neox-20b": "model.parallel_residual", "command-r": "model.parallel_residual",
                        # Gemma 2/3's sandwich and OLMo 2's post-norms, OLMoE's q/k norms over all heads,
                        # gpt-oss's sliding window and sinks (export/megatron.py NORM_FEATURES)
                        **dict.fromkeys(("gemma-2-9b", "gemma-2-27b", "gemma-3-12b", "gemma-3-27b", "olmo-2-7b",
                                         "olmo-2-13b"), "model.norm_position"),
                        "olmoe-1b-7b": "model.qk_norm_scope", "gpt-oss-20b": "model.sliding_window",
                        "gpt-oss-120b": "model.sliding_window",
                        # Mistral 7B v0.1's and Phi-3-mini/medium-4k's windows on every layer
                        **dict.fromkeys(("mistral-7b", "phi-3-mini-4k", "phi-3-medium-4k"), "model.sliding_window"),
                        **dict.fromkeys(("falcon-7b", "falcon-40b", "gpt-j-6b", "phi-2"), "model.parallel_residual"),
                        # catalog entries whose RoPE base no cited copy of their config.json confirms:
                        # refused rather than exported with Megatron's default 10,000 (--model config.json)
                        **dict.fromkeys(("granite-3-8b", "granite-3-3b-a800m", "phi-3.5-moe"), "model.rope_theta"),
                        "internlm3-8b": "model.rope_scaling"},  # dynamic NTK: no Megatron-LM flag
           "deepspeed": {},
           "torchtitan": {m.name: "model" for m in catalog.models() if m.name not in TORCHTITAN_MODELS}}


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_every_catalog_model_exports_and_validates_or_is_refused_by_name(target, monkeypatch):
    validated, refused = [], {}
    for spec in catalog.models():
        kw = dict(model=spec.name, gpus=8)
        if target == "torchtitan" and spec.name == "llama-3.1-405b":
            kw["precision"] = "fp8"  # torchtitan's only 405B config trains in Float8
        lay = planned(target, **kw)
        try:
            e = export_layout(lay, target)
        except PlanError as err:
            refused[spec.name] = err.field
            continue
        if target == "megatron":
            cfg = megatron_transformer_config(parse_megatron(e.text))
            assert cfg.num_layers == spec.layers
        elif target == "deepspeed":
            assert deepspeed_config(lay, monkeypatch)[1].train_batch_size == lay.gbs
        elif spec.name != "llama-3.1-405b":  # its Float8 converter needs torchao to build
            assert torchtitan_job(lay).model_spec.model.dim == spec.hidden
        validated.append(spec.name)
    assert refused == REFUSED[target]
    assert len(validated) + len(refused) == len(catalog.models())
