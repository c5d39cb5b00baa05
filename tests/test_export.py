"""Exports use only option names the frameworks accept, with values matching the plan."""

import json
import shlex
import tomllib

import pytest
from typer.testing import CliRunner

from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.export import export
from trainplan.plan import make_plan, resolve


@pytest.fixture(scope="module")
def names(data_dir=None):
    from pathlib import Path

    return tomllib.loads((Path(__file__).parent / "data" / "export_names.toml").read_text())


PLANS = [
    dict(model="llama-3-70b", gpus=64, tp=8, pp=4, sp=True, recompute="selective", zero=1, gbs=128),
    dict(model="mixtral-8x7b", gpus=32, tp=2, ep=8, zero=1, gbs=64, recompute="full", framework="megatron"),
    dict(model="gpt2-xl", gpus=8, precision="fp16", attention="eager", gbs=64, seq_len=1024),
    dict(model="llama-3-8b", gpus=16, pp=2, schedule="interleaved", vpp=2, gbs=64, precision="fp8"),
    dict(model="llama-3-8b", gpus=32, zero=3, dp_shard=8, gbs=64, framework="fsdp"),
    dict(model="llama-3-8b", gpus=8, zero=1, gbs=64, offload_optimizer=True, fused_loss=True),
]


def _megatron_args(text):
    args = {}
    tokens = shlex.split(" ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#")))
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            args[key] = tokens[i + 1]
            i += 2
        else:
            args[key] = True
            i += 1
    return args


@pytest.mark.parametrize("kw", PLANS)
def test_megatron_arguments(kw, names):
    lay = resolve(make_plan(**kw))
    args = _megatron_args(export(lay, "megatron"))
    accepted = set(names["megatron"]["options"])
    assert set(args) <= accepted, set(args) - accepted
    for opt, allowed in names["megatron"]["choices"].items():
        if opt in args:
            assert args[opt] in allowed, (opt, args[opt])
    assert int(args["--tensor-model-parallel-size"]) == lay.tp
    assert int(args["--pipeline-model-parallel-size"]) == lay.pp
    assert int(args["--global-batch-size"]) == lay.gbs and int(args["--micro-batch-size"]) == lay.mbs
    assert int(args["--num-layers"]) == lay.model.layers
    if lay.plan.schedule == "interleaved":
        assert int(args["--num-layers-per-virtual-pipeline-stage"]) * lay.vpp * lay.pp == lay.model.layers


@pytest.mark.parametrize("kw", PLANS)
def test_deepspeed_config(kw, names):
    lay = resolve(make_plan(**kw))
    cfg = json.loads(export(lay, "deepspeed"))
    ds = names["deepspeed"]
    assert set(cfg) <= set(ds["top_level"])
    assert set(cfg["zero_optimization"]) <= set(ds["zero_optimization"])
    # DeepSpeed's batch identity: train_batch_size = micro x accumulation x data parallel
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * lay.dp
    assert cfg["zero_optimization"]["stage"] == lay.zero
    assert cfg["bf16"]["enabled"] == (lay.plan.precision in ("bf16", "fp8"))


@pytest.mark.parametrize("kw", PLANS)
def test_torchtitan_toml(kw, names):
    lay = resolve(make_plan(**kw))
    cfg = tomllib.loads(export(lay, "torchtitan"))
    tt = names["torchtitan"]
    for section, keys in cfg.items():
        assert set(keys) <= set(tt[section]), (section, set(keys) - set(tt[section]))
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] in tt["schedules"]
    assert cfg["activation_checkpoint"]["mode"] in tt["ac_modes"]
    assert par.get("context_parallel_rotate_method", "allgather") in tt["cp_rotate_methods"]
    # ZeRO-2 (and ZeRO-1, which FSDP lacks) keeps each layer gathered until its backward
    assert par["fsdp_reshard_after_forward"] == ("never" if 0 < lay.zero < 3 else "default")
    assert par["fsdp_reshard_after_forward"] in tt["fsdp_reshard_policies"]
    assert cfg["optimizer"]["implementation"] in tt["optimizer_implementations"]
    degrees = (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"]
               * par["pipeline_parallel_degree"] * par["context_parallel_degree"])
    assert degrees == lay.gpus


def test_export_cli_writes_file(tmp_path):
    out = tmp_path / "ds.json"
    res = CliRunner().invoke(app, ["export", "--to", "deepspeed", "--model", "llama-3-8b", "--gpus", "8",
                                   "--zero", "2", "--gbs", "32", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["zero_optimization"]["stage"] == 2
    bad = CliRunner().invoke(app, ["export", "--to", "nemo"])
    assert bad.exit_code == 2 and "error: to:" in bad.output


def test_llama3_split_interleaves_in_torchtitan_but_not_megatron():
    """Llama 3 405B's 126 layers on 16 stages (7, 8, ..., 8, 7) with two virtual stages per rank:
    torchtitan cuts 128 weighted layers into 32 virtual stages of 4, the first and last one
    lighter; Megatron-LM's --num-layers-per-virtual-pipeline-stage needs equal ones, so a
    Megatron plan refuses the split and a Megatron export of another plan says why."""
    kw = dict(model="llama-3.1-405b", gpus=16384, tp=8, pp=16, schedule="interleaved", vpp=2, gbs=2048, seq_len=8192)
    lay = resolve(make_plan(**kw))
    assert lay.stage_layers == [7] + [8] * 14 + [7]
    par = tomllib.loads(export(lay, "torchtitan"))["parallelism"]
    assert (par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (4, 1, 1)
    with pytest.raises(PlanError, match="divisible by 2") as err:
        export(lay, "megatron")
    assert err.value.field == "vpp" and "torchtitan" in str(err.value)
    with pytest.raises(PlanError, match="divisible by 2"):
        resolve(make_plan(**kw, framework="megatron"))
    # the paper's own cut: one layer per virtual stage (v = 8), so the first virtual stage holds
    # only the embedding and the last only the head (Llama 3 paper §3.3.2; torchtitan counts each
    # as one layer)
    one_layer = resolve(make_plan(**{**kw, "vpp": 8}))
    par = tomllib.loads(export(one_layer, "torchtitan"))["parallelism"]
    assert (par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (1, 1, 1)
    even = resolve(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=4, schedule="interleaved", vpp=2, gbs=256))
    assert tomllib.loads(export(even, "torchtitan"))["parallelism"]["pipeline_parallel_layers_per_stage"] == 10
    with pytest.raises(PlanError, match="first and last one layer lighter"):
        resolve(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=4, schedule="interleaved", vpp=3, gbs=256))


def test_megatron_export_names_the_attention_kernel_transformer_engine_will_run():
    """Megatron-LM has no Triton FlashAttention, and its Transformer Engine picks FA2 before
    Hopper and cuDNN attention from Hopper on: an export whose plan priced another kernel
    says which one will run and how to match."""
    def text(gpu, attention):
        return export(resolve(make_plan(model="llama-3-8b", gpu=gpu, gpus=8, attention=attention)), "megatron")

    assert "--use-flash-attn" in text("A100-80GB-SXM", "triton")
    assert "# attention triton: Megatron-LM runs FlashAttention-2" in text("A100-80GB-SXM", "triton")
    assert "# attention triton: Megatron-LM runs cuDNN attention" in text("H100-SXM", "triton")
    assert "NVTE_FUSED_ATTN=0" in text("H100-SXM", "flash")
    assert "NVTE_FLASH_ATTN=0" in text("A100-80GB-SXM", "cudnn")
    assert "# attention" not in text("H100-SXM", "cudnn") and "# attention" not in text("A100-80GB-SXM", "flash")


def test_torchtitan_context_parallel_exchange():
    """A ring plan passes K/V shards around (torchtitan's "alltoall" rotation); an all-gather
    plan gathers them ("allgather"); without context parallelism the option is left out."""
    kw = dict(model="llama-3-8b", gpu="H100-SXM", gpus=16, cp=4, seq_len=65536, gbs=4)
    for cp_comm, method in (("ring", "alltoall"), ("allgather", "allgather")):
        par = tomllib.loads(export(resolve(make_plan(**kw, cp_comm=cp_comm)), "torchtitan"))["parallelism"]
        assert par["context_parallel_rotate_method"] == method
    no_cp = tomllib.loads(export(resolve(make_plan(**{**kw, "cp": 1, "gbs": 16})), "torchtitan"))["parallelism"]
    assert "context_parallel_rotate_method" not in no_cp


def test_recomputing_some_layers_in_megatron_and_torchtitan():
    """Recomputing the first 8 layers of each stage is Megatron-LM's block method with 8 layers;
    torchtitan's full checkpointing wraps every block, so its config says what the plan prices."""
    lay = resolve(make_plan(model="llama-3-8b", gpus=8, recompute="full", recompute_layers=8, framework="fsdp"))
    args = _megatron_args(export(lay, "megatron"))
    assert args["--recompute-method"] == "block" and args["--recompute-num-layers"] == "8"
    text = export(lay, "torchtitan")
    assert tomllib.loads(text)["activation_checkpoint"]["mode"] == "full"
    assert "# recompute full of the first 8 layers of each stage" in text


def test_offloading_reaches_every_export():
    """An offloaded optimizer: DeepSpeed's offload_optimizer, Megatron-LM's --optimizer-cpu-offload,
    torchtitan's enable_cpu_offload (which moves parameters, gradients and optimizer state
    together, so an optimizer-only plan says so)."""
    lay = resolve(make_plan(model="llama-3-8b", gpus=8, zero=3, offload_optimizer=True, framework="fsdp"))
    assert json.loads(export(lay, "deepspeed"))["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "--optimizer-cpu-offload" in _megatron_args(export(lay, "megatron"))
    text = export(lay, "torchtitan")
    assert tomllib.loads(text)["training"]["enable_cpu_offload"] is True
    assert "the plan offloads the optimizer only" in text
    both = export(resolve(make_plan(model="llama-3-8b", gpus=8, zero=3, offload_optimizer=True, offload_params=True,
                                    framework="fsdp")), "torchtitan")
    assert "enable_cpu_offload = true" in both and "# offload" not in both


def test_reduce_dtype_reaches_every_export(names):
    """bf16 gradient reduction: FSDP2's reduce_dtype in torchtitan, DeepSpeed's
    communication_data_type, and Megatron-LM's --grad-reduce-in-bf16, which also keeps the
    gradient buffer in bf16, so a Megatron plan states it as its gradient dtype."""
    kw = dict(model="llama-3-8b", gpus=16, zero=3, gbs=32)
    bf16 = resolve(make_plan(**kw, reduce_dtype="bf16"))
    default = resolve(make_plan(**kw))
    tt = [tomllib.loads(export(lay, "torchtitan"))["training"]["mixed_precision_reduce"] for lay in (bf16, default)]
    assert tt == ["bfloat16", "float32"] and set(tt) <= set(names["torchtitan"]["mixed_precision_dtypes"])
    ds = json.loads(export(bf16, "deepspeed"))
    assert ds["communication_data_type"] == "bf16" in names["deepspeed"]["communication_data_types"]
    assert "communication_data_type" not in json.loads(export(default, "deepspeed"))
    meg = dict(model="llama-3-8b", gpus=16, zero=1, gbs=32, framework="megatron")
    assert "--grad-reduce-in-bf16" in export(resolve(make_plan(**meg, grad_dtype="bf16")), "megatron")
    assert "--grad-reduce-in-bf16" not in export(resolve(make_plan(**meg)), "megatron")
    with pytest.raises(PlanError) as err:
        resolve(make_plan(**meg, reduce_dtype="bf16"))
    assert err.value.field == "reduce_dtype" and "--grad-dtype bf16" in str(err.value)
    resolve(make_plan(**meg, reduce_dtype="fp32"))  # the buffer's own dtype: nothing to refuse


def test_gradient_clipping_reaches_every_export():
    """The plan's clipping threshold is each framework's own option: Megatron-LM's --clip-grad,
    DeepSpeed's gradient_clipping, torchtitan's [training] max_norm (0 turns it off in all three)."""
    for clip in (0.5, 0.0):
        lay = resolve(make_plan(model="llama-3-8b", gpus=16, zero=1, gbs=32, grad_clip=clip))
        assert float(_megatron_args(export(lay, "megatron"))["--clip-grad"]) == clip
        assert json.loads(export(lay, "deepspeed"))["gradient_clipping"] == clip
        assert tomllib.loads(export(lay, "torchtitan"))["training"]["max_norm"] == clip


def test_exports_say_where_the_framework_runs_otherwise_than_the_plan():
    """torchtitan (FSDP2) always prefetches backward gathers and checkpoints non-reentrantly
    (stopping before each block's last linear); Megatron-LM re-runs a checkpointed layer
    whole. An export of a plan that assumes otherwise says so, and one that matches says nothing."""
    kw = dict(model="llama-3-8b", gpus=16, zero=3, gbs=32, recompute="full")
    tt = export(resolve(make_plan(**kw, backward_prefetch="post", recompute_early_stop=False)), "torchtitan")
    assert "--backward-prefetch pre" in tt and "--recompute-early-stop" in tt
    tomllib.loads(tt)  # the notes are TOML comments
    plain = export(resolve(make_plan(**kw, framework="fsdp")), "torchtitan")
    assert "--backward-prefetch" not in plain and "--recompute-early-stop" not in plain
    meg = export(resolve(make_plan(model="llama-3-8b", gpus=16, zero=1, gbs=32, recompute="full",
                                   framework="megatron", recompute_early_stop=True)), "megatron")
    assert "--no-recompute-early-stop" in meg
    assert "--no-recompute-early-stop" not in export(
        resolve(make_plan(model="llama-3-8b", gpus=16, zero=1, gbs=32, recompute="full", framework="megatron")),
        "megatron")


def test_hybrid_sharding_in_each_frameworks_terms():
    """--dp-shard 8 on 32 data-parallel ranks: torchtitan shards over 8 and replicates 4 ways
    (HSDP), DeepSpeed partitions ZeRO-3 within MiCS groups of 8, Megatron keeps 4 distributed
    optimizer instances."""
    kw = dict(model="llama-3-8b", gpus=32, dp_shard=8, gbs=64)
    par = tomllib.loads(export(resolve(make_plan(**kw, zero=3, framework="fsdp")), "torchtitan"))["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (8, 4)
    ds = json.loads(export(resolve(make_plan(**kw, zero=3)), "deepspeed"))
    assert ds["zero_optimization"]["mics_shard_size"] == 8
    args = _megatron_args(export(resolve(make_plan(**kw, zero=1, framework="megatron")), "megatron"))
    assert args["--num-distributed-optimizer-instances"] == "4"
    plain = _megatron_args(export(resolve(make_plan(**{**kw, "dp_shard": None}, zero=1, framework="megatron")),
                                  "megatron"))
    assert "--num-distributed-optimizer-instances" not in plain


def test_16_bit_optimizer_state_and_pure_16_bit_training_in_each_frameworks_terms():
    """Adam's moments in bf16 export to Megatron's precision-aware optimizer; DeepSpeed's config
    can express neither bf16 moments nor pure 16-bit training and refuses them by name."""
    kw = dict(model="llama-3-8b", gpus=8, zero=1)
    args = _megatron_args(export(resolve(make_plan(**kw, framework="megatron", optimizer_state_dtype="bf16")),
                                 "megatron"))
    assert args["--use-precision-aware-optimizer"] is True
    assert args["--exp-avg-dtype"] == args["--exp-avg-sq-dtype"] == "bf16"
    for bad, field in ((dict(master_weights=False), "master_weights"), (dict(optimizer_state_dtype="bf16"),
                                                                         "optimizer_state_dtype")):
        with pytest.raises(PlanError) as e:
            export(resolve(make_plan(**kw, **bad)), "deepspeed")
        assert e.value.field == field
    text = export(resolve(make_plan(**{**kw, "zero": 3}, framework="fsdp", master_weights=False)), "torchtitan")
    assert "# no master weights" in text


def test_lora_plans_export_to_deepspeed_only():
    """Megatron-LM's and torchtitan's configurations have no LoRA adapters: a LoRA or QLoRA plan
    is refused by name there (it used to export as full training); DeepSpeed's JSON holds with
    PEFT applying the adapters in the model code."""
    for finetune in ("lora", "qlora"):
        lay = resolve(make_plan(model="llama-3-8b", gpus=8, finetune=finetune))
        for target in ("megatron", "torchtitan"):
            with pytest.raises(PlanError) as e:
                export(lay, target)
            assert e.value.field == "finetune" and "deepspeed" in e.value.rule
        assert json.loads(export(lay, "deepspeed"))["train_batch_size"] == 8


def test_torchtitan_schedule_names_resolve_to_the_schedules_planned():
    """Each schedule name the torchtitan export writes is one torch's get_schedule_class (what
    torchtitan calls with it) accepts, and it names the class the planner's torch convention
    prices and `validate --pp` runs for that schedule (estimate/torch_schedules.py)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from trainplan.estimate.torch_schedules import TORCH_CLASSES
    from trainplan.export.torchtitan import SCHEDULES

    assert set(SCHEDULES) == set(TORCH_CLASSES)
    for planned, name in SCHEDULES.items():
        assert schedules.get_schedule_class(name) is getattr(schedules, TORCH_CLASSES[planned]), planned
