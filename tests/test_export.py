"""Exports write the planned run in each framework's terms, or refuse by name. These checks
need no framework installed; tests/test_export_frameworks.py lets the frameworks' own config
code validate the same exports."""

import json

import pytest
from typer.testing import CliRunner

from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.export import CONVENTIONS, export, export_layout, export_plan
from trainplan.plan import make_plan, resolve


def planned(target, **kw):
    return resolve(make_plan(**kw, framework=CONVENTIONS[target]))


def megatron(lay) -> dict:
    """The flags as `$(cat megatron_args.txt)` passes them: whitespace-split words."""
    words = export(lay, "megatron").split()
    args, i = {}, 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            args[words[i]], i = words[i + 1], i + 2
        else:
            args[words[i]], i = True, i + 1
    return args


def torchtitan(lay) -> dict:
    from trainplan.export.torchtitan import torchtitan_argv

    argv, out, i = torchtitan_argv(lay), {}, 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--") and ":" not in argv[i + 1]:
            out[argv[i]], i = argv[i + 1], i + 2
        else:
            out[argv[i]], i = True, i + 1
    return out


def test_torchtitan_runs_the_planned_batch_not_one_pass_of_it():
    """8 GPUs, ZeRO-3, GBS 64: eight accumulation steps of one sequence per GPU. The old TOML
    wrote local_batch_size = 8 and no global batch, one forward pass of 8 sequences."""
    tt = torchtitan(planned("torchtitan", model="llama-3.1-8b", gpus=8, zero=3, gbs=64))
    assert (tt["--training.local_batch_size"], tt["--training.global_batch_size"]) == ("1", "64")
    assert (tt["--module"], tt["--config"]) == ("llama3", "llama3_8b")
    # with pipelining the local batch is the pipeline's micro-batches of one
    pp = torchtitan(planned("torchtitan", model="llama-3.1-8b", gpus=16, pp=2, gbs=64, zero=0))
    assert (pp["--training.local_batch_size"], pp["--parallelism.pipeline_parallel_microbatch_size"],
            pp["--training.global_batch_size"]) == ("8", "1", "64")


def test_megatron_carries_the_model_it_plans():
    """Llama 3: rotary base 500,000 (not Megatron's 10,000); Llama 3.1 its scaled RoPE;
    DeepSeek-V3 multi-latent attention, one shared expert, three dense layers first, sigmoid
    routing over 8 groups, YaRN x40."""
    l3 = megatron(planned("megatron", model="llama-3-8b", gpus=8))
    assert l3["--rotary-base"] == "500000" and "--use-rope-scaling" not in l3 and l3["--norm-epsilon"] == "1e-05"
    l31 = megatron(planned("megatron", model="llama-3.1-8b", gpus=8))
    assert l31["--use-rope-scaling"] is True and l31["--rope-scaling-factor"] == "8.0"
    ds = megatron(planned("megatron", model="deepseek-v3", gpus=2048, pp=8, ep=64, gbs=4096))
    assert ds["--multi-latent-attention"] is True and ds["--q-lora-rank"] == "1536" and ds["--kv-lora-rank"] == "512"
    assert ds["--moe-shared-expert-intermediate-size"] == "2048"
    assert ds["--moe-layer-freq"] == "([0]*3+[1]*58)"
    assert (ds["--moe-router-score-function"], ds["--moe-router-topk-scaling-factor"], ds["--moe-router-num-groups"],
            ds["--moe-router-group-topk"]) == ("sigmoid", "2.5", "8", "4")
    assert ds["--moe-router-enable-expert-bias"] is True
    assert (ds["--rope-type"], ds["--rotary-scaling-factor"]) == ("yarn", "40.0")
    q15 = megatron(planned("megatron", model="qwen1.5-moe-a2.7b", gpus=8, ep=4))
    assert q15["--moe-router-pre-softmax"] is True and q15["--moe-shared-expert-gate"] is True  # norm_topk_prob false


def test_megatron_rotates_as_the_model_card_does():
    """The rotary base each config.json states (catalog comments cite the copies): Phi-4 250,000;
    GLM-4-9B-chat 10,000 x rope_ratio 500 on half of each head, on adjacent pairs
    (transformers' GLM rotate_half); StableLM 2 on a quarter, on halves. Megatron's defaults
    (10,000, all of the head, halves) are not what these models run."""
    phi4 = megatron(planned("megatron", model="phi-4", gpus=8))
    assert phi4["--rotary-base"] == "250000" and "--rotary-percent" not in phi4 and "--rotary-interleaved" not in phi4
    glm = megatron(planned("megatron", model="glm-4-9b", gpus=8))
    assert (glm["--rotary-base"], glm["--rotary-percent"], glm["--rotary-interleaved"]) == ("5000000", "0.5", True)
    slm = megatron(planned("megatron", model="stablelm-2-1.6b", gpus=8))
    assert (slm["--rotary-base"], slm["--rotary-percent"]) == ("10000", "0.25") and "--rotary-interleaved" not in slm
    # a rotary model whose spec states no base is still refused, not given Megatron's default;
    # InternLM3's base 5e7 comes with dynamic NTK scaling (factor 6), which Megatron-LM has no flag for
    # Phi-3's 2,047-key window on every layer is not Megatron's full attention: refused by name
    for name, field in (("granite-3-8b", "model.rope_theta"), ("internlm3-8b", "model.rope_scaling"),
                        ("phi-3-mini-4k", "model.sliding_window")):
        with pytest.raises(PlanError) as err:
            megatron(planned("megatron", model=name, gpus=8))
        assert err.value.field == field


def test_megatron_uneven_pipeline_splits_are_flags_not_comments():
    """405B on PP 16 (7, 8 x 14, 7): Megatron's first/last stage flags; DeepSeek-V3 on PP 8
    (7, 8 x 5, 7, 7): its pipeline layout string. Both used to fail "Number of layers should
    be divisible"."""
    l405 = megatron(planned("megatron", model="llama-3.1-405b", gpus=16384, tp=8, pp=16, gbs=2048))
    assert (l405["--decoder-first-pipeline-num-layers"], l405["--decoder-last-pipeline-num-layers"]) == ("7", "7")
    ds = megatron(planned("megatron", model="deepseek-v3", gpus=2048, pp=8, ep=64, gbs=4096))
    assert ds["--pipeline-model-parallel-layout"] == "Et*7|t*8|t*8|t*8|t*8|t*8|t*7|t*7L"
    even = megatron(planned("megatron", model="llama-3-70b", gpus=64, tp=8, pp=4, schedule="interleaved", vpp=2,
                            gbs=256))
    assert even["--num-virtual-stages-per-pipeline-rank"] == "2" and "--pipeline-model-parallel-layout" not in even


def test_megatron_args_file_holds_flags_only_and_notes_go_apart():
    e = export_layout(planned("megatron", model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8, attention="triton"),
                      "megatron")
    assert all(line.startswith("--") for line in e.text.splitlines()) and "#" not in e.text and "\\" not in e.text
    assert any(n.startswith("attention triton: Megatron-LM runs FlashAttention-2") for n in e.notes)
    assert any("--lr" in n for n in e.notes) and "--lr" not in e.text.split()


def test_megatron_export_names_the_attention_kernel_transformer_engine_will_run():
    """Transformer Engine picks FA2 before Hopper and cuDNN attention from Hopper on: an export
    whose plan priced another kernel says which one will run and how to match."""
    def notes(gpu, attention):
        return " ".join(export_layout(planned("megatron", model="llama-3-8b", gpu=gpu, gpus=8, attention=attention),
                                      "megatron").notes)

    assert "attention triton: Megatron-LM runs cuDNN attention" in notes("H100-SXM", "triton")
    assert "NVTE_FUSED_ATTN=0" in notes("H100-SXM", "flash")
    assert "NVTE_FLASH_ATTN=0" in notes("A100-80GB-SXM", "cudnn")
    assert "attention" not in notes("H100-SXM", "cudnn") and "attention" not in notes("A100-80GB-SXM", "flash")


def test_deepspeed_writes_tensor_and_expert_parallelism_and_its_optimizer_names():
    """TP is AutoTP's autotp_size and EP AutoEP's autoep_size, so DeepSpeed's batch check divides
    by the data-parallel ranks left; optimizers by DeepSpeed's names, no learning rate invented."""
    lay = planned("deepspeed", model="llama-3-70b", gpus=64, tp=8, zero=1, optimizer="adafactor", gbs=512)
    cfg = json.loads(export(lay, "deepspeed"))
    assert cfg["tensor_parallel"] == {"autotp_size": 8}
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 8
    assert cfg["optimizer"] == {"type": "Adafactor", "params": {}} and cfg["zero_allow_untested_optimizer"] is True
    assert "lr" in cfg["_set_before_launch"]
    names = {o: json.loads(export(planned("deepspeed", model="llama-3-8b", gpus=8, optimizer=o), "deepspeed"))
             ["optimizer"]["type"] for o in ("adamw", "adam", "lion", "sgd-momentum")}
    assert names == {"adamw": "AdamW", "adam": "Adam", "lion": "Lion", "sgd-momentum": "SGD"}
    moe = json.loads(export(planned("deepspeed", model="mixtral-8x7b", gpus=16, ep=8, zero=2, gbs=64), "deepspeed"))
    assert moe["expert_parallel"] == {"enabled": True, "autoep_size": 8}


@pytest.mark.parametrize("target, kw, field", [
    ("deepspeed", dict(model="llama-3-70b", gpus=64, tp=8, pp=4, zero=1, optimizer="adafactor", gbs=128), "pp"),
    ("deepspeed", dict(model="llama-3-8b", gpus=8, precision="fp8"), "precision"),
    ("deepspeed", dict(model="llama-3-8b", gpus=8, optimizer="adam-8bit"), "optimizer"),
    ("megatron", dict(model="llama-3-8b", gpus=8, optimizer="lion"), "optimizer"),
    ("megatron", dict(model="llama-3-8b", gpus=16, pp=2, schedule="zb", gbs=64), "schedule"),
    ("torchtitan", dict(model="mixtral-8x7b", gpus=8), "model"),
    ("torchtitan", dict(model="llama-3.1-8b", gpus=8, reduce_dtype="bf16"), "reduce_dtype"),
])
def test_what_a_target_cannot_express_is_refused_on_one_line_with_exit_2(target, kw, field):
    with pytest.raises(PlanError) as err:
        export_layout(planned(target, **kw), target)
    assert err.value.field == field
    args = ["export", "--to", target]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and res.output.startswith(f"error: {field}:") and res.output.count("\n") == 1


def test_export_cli_writes_file_and_plans_under_the_targets_conventions(tmp_path):
    out = tmp_path / "ds.json"
    res = CliRunner().invoke(app, ["export", "--to", "deepspeed", "--model", "llama-3-8b", "--gpus", "8",
                                   "--zero", "2", "--gbs", "32", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["zero_optimization"]["stage"] == 2
    assert "note: yours to set" in res.output
    bad = CliRunner().invoke(app, ["export", "--to", "nemo"])
    assert bad.exit_code == 2 and "error: to:" in bad.output
    other = CliRunner().invoke(app, ["export", "--to", "megatron", "--framework", "deepspeed"])
    assert other.exit_code == 2 and "error: framework:" in other.output and "megatron" in other.output


def test_search_export_ranks_under_the_targets_conventions():
    """Llama 3 70B on 64 H100s: ranked under DeepSpeed's conventions, the best layout (TP 2,
    PP 4, CP 4, 4 virtual stages) needs 80.7 GiB under Megatron's, more than the 80 GiB there
    is; `search --export megatron` ranks under Megatron's and exports a layout that fits."""
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-70b", "--gpus", "64", "--export", "megatron"])
    assert res.exit_code == 0, res.output
    args = {}
    words = [w for w in res.stdout.split()]
    for i, w in enumerate(words):
        if w.startswith("--"):
            args[w] = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
    dims = dict(tp=int(args["--tensor-model-parallel-size"]), pp=int(args["--pipeline-model-parallel-size"]),
                cp=int(args["--context-parallel-size"]), sp="--sequence-parallel" in args,
                gbs=int(args["--global-batch-size"]), mbs=int(args["--micro-batch-size"]))
    if "--num-virtual-stages-per-pipeline-rank" in args:
        dims.update(schedule="interleaved", vpp=int(args["--num-virtual-stages-per-pipeline-rank"]))
    from trainplan.report import evaluate

    def peak_gib(**kw):
        r = evaluate(make_plan(model="llama-3-70b", gpus=64, framework="megatron", zero=1, **kw))
        return r.peak / 2**30

    assert peak_gib(**dims) < 80
    # the layout DeepSpeed's conventions rank first, under Megatron's
    assert peak_gib(tp=2, pp=4, cp=4, sp=True, schedule="interleaved", vpp=4, gbs=1024) == pytest.approx(80.68, abs=0.05)


def test_export_plan_gives_a_file_name_and_its_text():
    """The page's Export button: plan options in, (file name, text) out, under the target's
    conventions; a refusal is a PlanError."""
    name, text = export_plan({"model": "llama-3.1-8b", "gpus": 8, "zero": 3, "gbs": 64}, "torchtitan")
    assert name == "run_torchtitan.sh" and text.startswith("#!/usr/bin/env bash") and "--config llama3_8b" in text
    name, text = export_plan({"model": "llama-3-8b", "gpus": 8}, "deepspeed")
    assert name == "ds_config.json" and json.loads(text)["train_batch_size"] == 8
    with pytest.raises(PlanError) as err:
        export_plan({"model": "llama-3-8b", "gpus": 8, "framework": "fsdp"}, "megatron")
    assert err.value.field == "framework"


def test_llama3_split_interleaves_in_torchtitan_but_not_megatron():
    """Llama 3 405B's 126 layers on 16 stages (7, 8, ..., 8, 7) with two virtual stages per rank:
    torchtitan cuts 128 weighted layers into 32 virtual stages of 4, the first and last one
    lighter; Megatron's virtual stages need each stage's layers divisible by 2, so a Megatron
    plan refuses the split and a Megatron export of another plan says why."""
    kw = dict(model="llama-3.1-405b", gpus=16384, tp=8, pp=16, schedule="interleaved", vpp=2, gbs=2048, seq_len=8192,
              precision="fp8")
    lay = planned("torchtitan", **kw)
    assert lay.stage_layers == [7] + [8] * 14 + [7]
    tt = torchtitan(lay)
    assert (tt["--parallelism.pipeline_parallel_layers_per_stage"], tt["--parallelism.pipeline_parallel_first_stage_less_layers"],
            tt["--parallelism.pipeline_parallel_last_stage_less_layers"]) == ("4", "1", "1")
    with pytest.raises(PlanError) as err:
        export(lay, "megatron")
    assert err.value.field == "vpp" and "torchtitan" in str(err.value)
    with pytest.raises(PlanError, match="divisible by 2"):
        resolve(make_plan(**kw, framework="megatron"))
    # the paper's own cut: one layer per virtual stage (v = 8), the first virtual stage holding
    # only the embedding and the last only the head (Llama 3 paper §3.3.2)
    one = torchtitan(planned("torchtitan", **{**kw, "vpp": 8}))
    assert one["--parallelism.pipeline_parallel_layers_per_stage"] == "1"


def test_recomputing_some_layers():
    """The first 8 layers of each stage: Megatron's block method; torchtitan's full
    checkpointing wraps every block, so it refuses."""
    args = megatron(planned("megatron", model="llama-3-8b", gpus=8, recompute="full", recompute_layers=8))
    assert args["--recompute-method"] == "block" and args["--recompute-num-layers"] == "8"
    with pytest.raises(PlanError) as err:
        export(planned("torchtitan", model="llama-3.1-8b", gpus=8, recompute="full", recompute_layers=8),
               "torchtitan")
    assert err.value.field == "recompute_layers"


def test_offloading_reaches_every_export():
    """DeepSpeed's offload_optimizer, Megatron's --optimizer-cpu-offload; torchtitan's
    enable_cpu_offload moves parameters, gradients and optimizer state together."""
    kw = dict(model="llama-3-8b", gpus=8, zero=3, offload_optimizer=True)
    assert json.loads(export(planned("deepspeed", **kw), "deepspeed"))["zero_optimization"]["offload_optimizer"][
        "device"] == "cpu"
    assert megatron(planned("megatron", **kw))["--optimizer-cpu-offload"] is True
    both = torchtitan(planned("torchtitan", **{**kw, "model": "llama-3.1-8b", "offload_params": True}))
    assert both["--training.enable-cpu-offload"] is True
    with pytest.raises(PlanError):
        export(planned("torchtitan", **{**kw, "model": "llama-3.1-8b"}), "torchtitan")


def test_reduce_dtype_and_gradient_clipping_reach_every_export():
    kw = dict(model="llama-3-8b", gpus=16, zero=3, gbs=32)
    assert json.loads(export(planned("deepspeed", **kw, reduce_dtype="bf16"), "deepspeed"))[
        "communication_data_type"] == "bf16"
    meg = dict(model="llama-3-8b", gpus=16, zero=1, gbs=32)
    assert megatron(planned("megatron", **meg, grad_dtype="bf16"))["--grad-reduce-in-bf16"] is True
    assert "--grad-reduce-in-bf16" not in megatron(planned("megatron", **meg))
    for clip in (0.5, 0.0):
        assert float(megatron(planned("megatron", **meg, grad_clip=clip))["--clip-grad"]) == clip
        assert json.loads(export(planned("deepspeed", **meg, grad_clip=clip), "deepspeed"))["gradient_clipping"] == clip
        assert float(torchtitan(planned("torchtitan", **{**kw, "model": "llama-3.1-8b"}, grad_clip=clip))[
            "--training.max_norm"]) == clip


def test_hybrid_sharding_in_each_frameworks_terms():
    """--dp-shard 8 on 32 data-parallel ranks: torchtitan shards over 8 and replicates 4 ways
    (HSDP), Megatron keeps 4 distributed-optimizer instances; DeepSpeed 0.19 dropped MiCS."""
    kw = dict(gpus=32, dp_shard=8, gbs=64)
    tt = torchtitan(planned("torchtitan", model="llama-3.1-8b", zero=3, **kw))
    assert (tt["--parallelism.data_parallel_shard_degree"], tt["--parallelism.data_parallel_replicate_degree"]) == (
        "8", "4")
    assert megatron(planned("megatron", model="llama-3-8b", zero=1, **kw))["--num-distributed-optimizer-instances"] == "4"
    with pytest.raises(PlanError) as err:
        export(planned("deepspeed", model="llama-3-8b", zero=3, **kw), "deepspeed")
    assert err.value.field == "dp_shard"


def test_16_bit_optimizer_state_and_pure_16_bit_training_in_each_frameworks_terms():
    """bf16 moments: Megatron's precision-aware optimizer, torchtitan's fused_opt_states_bf16;
    pure bf16 training: torchtitan's training.dtype bfloat16. DeepSpeed expresses neither and
    Megatron has no pure 16-bit training: refused by name."""
    args = megatron(planned("megatron", model="llama-3-8b", gpus=8, zero=1, optimizer_state_dtype="bf16"))
    assert args["--use-precision-aware-optimizer"] is True and args["--exp-avg-dtype"] == "bf16"
    tt = torchtitan(planned("torchtitan", model="llama-3.1-8b", gpus=8, optimizer_state_dtype="bf16"))
    assert tt["--optimizer.implementation"] == "fused_opt_states_bf16"
    pure = torchtitan(planned("torchtitan", model="llama-3.1-8b", gpus=8, master_weights=False))
    assert pure["--training.dtype"] == "bfloat16"
    for target, bad, field in (("deepspeed", dict(master_weights=False), "master_weights"),
                               ("deepspeed", dict(optimizer_state_dtype="bf16"), "optimizer_state_dtype"),
                               ("megatron", dict(master_weights=False), "master_weights")):
        with pytest.raises(PlanError) as e:
            export(planned(target, model="llama-3-8b", gpus=8, zero=1, **bad), target)
        assert e.value.field == field


def test_lora_plans_export_to_deepspeed_only():
    for finetune in ("lora", "qlora"):
        for target in ("megatron", "torchtitan"):
            with pytest.raises(PlanError) as e:
                export(resolve(make_plan(model="llama-3.1-8b", gpus=8, finetune=finetune)), target)
            assert e.value.field == "finetune" and "deepspeed" in e.value.rule
        lay = planned("deepspeed", model="llama-3-8b", gpus=8, finetune=finetune)
        assert json.loads(export(lay, "deepspeed"))["train_batch_size"] == 8


def test_torchtitan_schedule_names_resolve_to_the_schedules_planned():
    """Each schedule name the torchtitan export writes is one torch's get_schedule_class (what
    torchtitan calls with it) accepts, naming the class the planner's torch convention prices."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from trainplan.estimate.torch_schedules import TORCH_CLASSES
    from trainplan.export.torchtitan import SCHEDULES

    assert set(SCHEDULES) == set(TORCH_CLASSES)
    for planned_schedule, name in SCHEDULES.items():
        assert schedules.get_schedule_class(name) is getattr(schedules, TORCH_CLASSES[planned_schedule])


def test_torchtitan_script_passes_exactly_the_exported_arguments(tmp_path):
    """bash expands the script's ARGS array to the argument list the framework tests parse."""
    import shutil
    import subprocess

    from trainplan.export.torchtitan import torchtitan_argv

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    lay = planned("torchtitan", model="llama-3.1-70b", gpus=64, tp=8, sp=True, pp=4, schedule="interleaved", vpp=2,
                  gbs=256, zero=3)
    script = tmp_path / "run.sh"
    script.write_text(export(lay, "torchtitan").replace('exec torchrun', 'printf "%s\\n" "${ARGS[@]}" # torchrun'))
    out = subprocess.run([bash, str(script)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == torchtitan_argv(lay)
    assert "--nnodes 8 --nproc-per-node 8" in export(lay, "torchtitan")


def test_the_rotary_norm_and_router_settings_come_from_config_json():
    """What an export repeats of the model is read from config.json (tests/data/hf, as
    published) and agrees with the catalog; transformers 5's nested rope_parameters too."""
    from pathlib import Path

    from trainplan.specs import catalog, hf

    fields = ("rope_theta", "norm_eps", "router_score", "router_norm_topk", "router_scale", "router_groups",
              "router_group_topk")
    for path in sorted((Path(__file__).parent / "data" / "hf").glob("*.json")):
        mine, theirs = hf.from_file(path), catalog.model(path.stem)
        assert {f: getattr(mine, f) for f in fields} == {f: getattr(theirs, f) for f in fields}, path.stem
    ds = hf.from_file(Path(__file__).parent / "data" / "hf" / "deepseek-v3.json")
    assert (ds.router_score, ds.router_scale, ds.router_groups, ds.router_group_topk) == ("sigmoid", 2.5, 8, 4)
    assert hf.from_file(Path(__file__).parent / "data" / "hf" / "qwen1.5-moe-a2.7b.json").router_norm_topk is False
    base = json.loads((Path(__file__).parent / "data" / "hf" / "llama-3-8b.json").read_text())
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    old_style = hf.from_dict({**base, "rope_scaling": llama31})
    new_style = hf.from_dict({**{k: v for k, v in base.items() if k != "rope_theta"},
                              "rope_parameters": {**llama31, "rope_theta": 500000.0}})
    assert old_style.rope_scaling == new_style.rope_scaling == catalog.model("llama-3.1-8b").rope_scaling
    assert new_style.rope_theta == 500000.0
    with pytest.raises(PlanError) as err:
        hf.from_dict({**base, "rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2.0}})
    assert err.value.field == "hf_config.rope_scaling"


def test_search_export_keeps_to_what_the_target_expresses():
    """DeepSpeed's JSON has no pipeline stages, context or sequence parallelism: `search --export
    deepspeed` ranks layouts without them (ZeRO, TP, micro-batch, recompute still searched)."""
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-70b", "--gpus", "64", "--export", "deepspeed"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.stdout)
    tp = cfg.get("tensor_parallel", {}).get("autotp_size", 1)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * (
        64 // tp)
