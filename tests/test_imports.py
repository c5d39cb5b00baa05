"""`plan --from` / `search --from`: real Megatron-LM, DeepSpeed and torchtitan configurations
(tests/data/imports/SOURCE names each one's repository, path and commit) plan exactly the run
they describe: the same plan as the same settings given as options, read off the file by hand."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from trainplan import plan
from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.imports import read_config

RUNNER = CliRunner()


def same_plan(got: dict, want: dict) -> None:
    got = {k: v for k, v in got.items() if k != "import"}
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_megatron_gpt3_175b(data_dir):
    """examples/gpt3/train_gpt3_175b_distributed.sh: TP 8 x PP 16, fp16, global batch 1,536 of
    2,048 tokens, GPT-2's vocabulary padded by Megatron to 51,200 (128 x TP 8): the catalog's
    megatron-175b. Its launcher starts one node; the run is planned on 1,024 GPUs given alongside."""
    f = data_dir / "imports/megatron_train_gpt3_175b_distributed.sh"
    imp = read_config(f)
    assert imp.options["model"] == "megatron-175b"
    assert imp.options["gpus"] == 8  # --nproc_per_node 8 x --nnodes 1
    assert any("--step-batch-size-schedule" in n for n in imp.notes)  # the batch ramp, said so
    want = plan(model="megatron-175b", framework="megatron", gpus=1024, tp=8, pp=16, mbs=1, gbs=1536, seq_len=2048,
                precision="fp16", zero=0, dropout=0.1, overlap_dp=False, grad_clip=1.0)
    same_plan(plan(from_file=str(f), gpus=1024), want)
    assert want["parallel"]["dp"] == 8 and want["model"]["name"] == "megatron-175b"


def test_megatron_gpt3_175b_on_its_launcher_gpus_is_refused(data_dir):
    """As written (8 GPUs) the script cannot hold TP 8 x PP 16: one error naming the GPU count."""
    res = RUNNER.invoke(app, ["plan", "--from", str(data_dir / "imports/megatron_train_gpt3_175b_distributed.sh")])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines()[-1].startswith("error: gpus:")


def test_megatron_llama3_8b_fp8(data_dir):
    """examples/llama/train_llama3_8b_h100_fp8.sh: the script's if-branches decided (DTYPE=fp8,
    mock data), its arrays expanded; Llama 3 8B in FP8 with bf16 gradient reduction, the
    distributed optimizer, overlapped reduction, cuDNN ("fused") attention and the fused loss."""
    f = data_dir / "imports/megatron_train_llama3_8b_h100_fp8.sh"
    imp = read_config(f)
    assert imp.options["model"] == "llama-3-8b"
    assert imp.options["fp8_params"] and not any("fp8-param-gather" in u for u in imp.unknown)
    assert "--lr" in imp.ignored and "--rotary-base" in imp.ignored
    want = plan(model="llama-3-8b", framework="megatron", gpus=8, tp=1, cp=1, sp=True, mbs=1, gbs=128, seq_len=8192,
                precision="fp8", grad_dtype="bf16", zero=1, overlap_dp=True, attention="cudnn", fused_loss=True,
                dropout=0.0, grad_clip=1.0, fp8_params=True)
    same_plan(plan(from_file=str(f), gpu="H100-SXM"), want)


def test_megatron_mixtral_8x7b_with_overrides(data_dir):
    """examples/mixtral/train_mixtral_8x7b_distributed.sh: PP 4, EP 8, SP, the distributed
    optimizer; options given alongside (64 GPUs, micro-batch 2) override the file."""
    f = data_dir / "imports/megatron_train_mixtral_8x7b_distributed.sh"
    imp = read_config(f)
    assert imp.options["model"] == "mixtral-8x7b"  # Llama2Tokenizer's 32,000 tokens, the catalog's
    want = plan(model="mixtral-8x7b", framework="megatron", gpus=64, tp=1, pp=4, ep=8, sp=True, mbs=2, gbs=256,
                seq_len=4096, precision="bf16", zero=1, overlap_dp=True, dropout=0.0)
    same_plan(plan(from_file=str(f), gpus=64, mbs=2), want)
    assert want["parallel"]["pp"] == 4 and want["parallel"]["mbs"] == 2


def test_megatron_args_file_uneven_split_and_custom_model(tmp_path):
    """A plain arguments file (comments, continuations) with an uneven pipeline split and a model
    in no catalog entry (vocabulary fixed by --vocab-size): planned from its flags."""
    f = tmp_path / "args.sh"
    f.write_text("# my run\n--num-layers 30 --hidden-size 2048 --num-attention-heads 16 \\\n"
                 "--group-query-attention --num-query-groups 4 --ffn-hidden-size 5632 --swiglu \\\n"
                 "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights \\\n"
                 "--disable-bias-linear --vocab-size 32000 --seq-length 4096 --max-position-embeddings 4096 \\\n"
                 "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
                 "--decoder-last-pipeline-num-layers 6 --micro-batch-size 1 --global-batch-size 64 --bf16\n")
    imp = read_config(f)
    assert imp.options["stage_layers"] == [6, 9, 9, 6]
    cfg = imp.options["hf_config"]
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["vocab_size"]) == \
        ("llama", 30, 4, 32000)  # 32,000 is a multiple of 128: Megatron's padding keeps it
    got = plan(from_file=str(f), gpus=16)
    assert [s["layers"] for s in got["memory"]["stages"]] == [6, 9, 9, 6]
    # 30 x (4 x 2048^2 x (1 + 2 x 4/16) ... ): the exact count of a Llama-style layer stack
    h, f_, kv = 2048, 5632, 2048 * 4 // 16
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f_ + 2 * h
    assert got["model"]["params"] == 30 * per_layer + 2 * 32000 * h + h


def test_megatron_model_flag_not_understood_is_refused(tmp_path):
    f = tmp_path / "args.txt"
    f.write_text("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --vocab-size 32000 --mtp-num-layers 1\n")
    with pytest.raises(PlanError) as err:
        read_config(f)
    assert err.value.field == "from.mtp-num-layers" and "--mtp-num-layers" in err.value.rule
    res = RUNNER.invoke(app, ["plan", "--from", str(f)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "mtp-num-layers" in res.stderr


def test_megatron_flags_not_understood_listed_on_stderr(tmp_path):
    f = tmp_path / "args.txt"
    f.write_text("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 --swiglu "
                 "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
                 "--disable-bias-linear --vocab-size 32000 --max-position-embeddings 4096 --bf16 "
                 "--frobnicate 3 --lr 3e-4\n")
    res = RUNNER.invoke(app, ["plan", "--from", str(f), "--json"])
    assert res.exit_code == 0, res.output
    assert "megatron: the arguments' model is llama-2-7b" in res.stderr
    assert "megatron: not understood, not planned: --frobnicate" in res.stderr
    assert "megatron: read, not part of a plan: --lr" in res.stderr
    data = json.loads(res.stdout)
    assert data["import"]["not_understood"] == ["--frobnicate"] and data["model"]["name"] == "llama-2-7b"


def test_torchtitan_toml_jobs(data_dir):
    """torchtitan's last TOML job files: 8B (FSDP, per-op selective AC: selective_ac_option 'op'),
    70B (TP 8, full AC), 405B (TP 8, float8 converters, async TP, compiled: fused norms and
    SwiGLU); the data-parallel degree (-1) filled from the GPUs."""
    d = data_dir / "imports"
    want = plan(model="llama-3.1-70b", framework="fsdp", gpus=64, tp=8, sp=True, zero=3, mbs=8, gbs=64, seq_len=8192,
                recompute="full", precision="bf16", optimizer="adamw")
    same_plan(plan(from_file=str(d / "torchtitan_llama3_70b.toml"), gpus=64), want)
    o405 = read_config(d / "torchtitan_llama3_405b.toml").options
    assert (o405["model"], o405["precision"], o405["overlap_tp"], o405["tp"], o405["mbs"], o405["fused_kernels"]) == \
        ("llama-3.1-405b", "fp8", True, 8, 2, True)
    o8 = read_config(d / "torchtitan_llama3_8b.toml").options  # `batch_size`, the key before local_batch_size
    assert (o8["model"], o8["recompute"], o8["mbs"], o8["zero"]) == ("llama-3.1-8b", "selective-op", 1, 3)


def test_torchtitan_global_batch_is_local_times_dp(data_dir):
    """torchtitan (trainer.py): without global_batch_size the step's batch is local_batch_size x
    the data-parallel degree: 8 x 8 on 64 GPUs at TP 8 (70B)."""
    got = plan(from_file=str(data_dir / "imports/torchtitan_llama3_70b.toml"), gpus=64)
    assert (got["parallel"]["dp"], got["parallel"]["gbs"], got["parallel"]["mbs"]) == (8, 64, 8)


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="needs the frameworks extra (torchtitan)")
def test_torchtitan_03_command_line(data_dir, tmp_path):
    """torchtitan 0.3: the README's `MODULE=llama3 CONFIG=llama3_8b ./run_train.sh` is read through
    torchtitan's own config_registry.llama3_8b (local batch 1, seq 8,192, per-op selective AC,
    the fused AdamW), and a
    dotted override on the command line applies."""
    got = plan(from_file=str(data_dir / "imports/torchtitan_readme_llama3_8b.sh"))
    want = plan(model="llama-3.1-8b", framework="fsdp", gpus=8, zero=3, mbs=1, gbs=8, seq_len=8192,
                recompute="selective-op", precision="bf16", optimizer_impl="fused")
    same_plan(got, want)
    f = tmp_path / "run.sh"
    f.write_text("NGPU=16 MODULE=llama3 CONFIG=llama3_8b ./run_train.sh --parallelism.tensor_parallel_degree 2 "
                 "--training.local_batch_size=2\n")
    o = read_config(f).options
    assert (o["tp"], o["sp"], o["mbs"], o["gpus"]) == (2, True, 2, 16)


def test_deepspeed_configs_with_model(data_dir):
    """DeepSpeedExamples: ZenFlow's ZeRO-2 with the optimizer on the host (train_batch_size 8,
    accumulation 1: micro-batch 1 on 8 GPUs; its zenflow block listed as not understood), the
    autotuner's fp16 ZeRO-3 and the AutoTP example (TP 4, "auto" batch sizes)."""
    d = data_dir / "imports"
    zf = read_config(d / "deepspeed_zf_config.json", model_given=True)
    assert zf.unknown == ["zero_optimization.zenflow"]
    want = plan(model="llama-2-7b", framework="deepspeed", gpus=8, gbs=8, mbs=1, zero=2, offload_optimizer=True,
                overlap_dp=False, precision="bf16", grad_clip=1.0)
    same_plan(plan(from_file=str(d / "deepspeed_zf_config.json"), model="llama-2-7b", gpus=8), want)
    z3 = read_config(d / "deepspeed_ds_config_fp16_z3.json", model_given=True).options
    assert (z3["zero"], z3["precision"], z3["overlap_dp"], z3["grad_clip"]) == (3, "fp16", True, 0.0)
    tp = read_config(d / "deepspeed_autotp_ds_config.json", model_given=True)
    assert (tp.options["tp"], tp.options["zero"]) == (4, 2)
    assert any('"auto"' in n for n in tp.notes)


def test_deepspeed_needs_a_model_and_takes_hf_config(data_dir):
    f = str(data_dir / "imports/deepspeed_zf_config.json")
    res = RUNNER.invoke(app, ["plan", "--from", f, "--gpus", "8"])
    assert res.exit_code == 2 and res.stderr.startswith("error: model:") and res.stderr.count("\n") == 1
    got = plan(from_file=f, hf_config=str(data_dir / "hf/llama-3-8b.json"), gpus=8)
    assert got["model"]["params"] == plan(model="llama-3-8b")["model"]["params"]


@pytest.mark.parametrize("text, field", [
    ("{not json", "from"),
    ('{"zero_optimization": {"stage": 5}}', "from.zero_optimization.stage"),
    ('{"optimizer": {"type": "Adagrad"}}', "from.optimizer.type"),
    ('{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}',
     "from.train_batch_size"),
])
def test_bad_deepspeed_files(tmp_path, text, field):
    f = tmp_path / "ds.json"
    f.write_text(text)
    res = RUNNER.invoke(app, ["plan", "--from", str(f), "--model", "llama-3-8b"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert res.stderr.startswith(f"error: {field}:"), res.stderr


def test_missing_file_is_one_error(tmp_path):
    res = RUNNER.invoke(app, ["plan", "--from", str(tmp_path / "nope.sh")])
    assert res.exit_code == 2 and res.stderr.startswith("error: from:") and res.stderr.count("\n") == 1


def test_search_from_keeps_the_model_and_searches_the_layout(data_dir):
    res = RUNNER.invoke(app, ["search", "--from", str(data_dir / "imports/torchtitan_llama3_70b.toml"),
                              "--gpus", "64", "--top", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    best = data["best"][0]
    assert best["model"]["name"] == "llama-3.1-70b" and best["parallel"]["gbs"] == 64
    assert data["import"]["format"] == "torchtitan"


def test_shell_reading(tmp_path):
    """Bash as launch scripts write it: defaults, arithmetic, arrays appended to, quoted words
    split by an unquoted expansion, decided and undecidable tests (the latter reported)."""
    from trainplan.imports.shell import command_words

    script = """#!/bin/bash
NODES=${NNODES:-2}
PER_NODE=8
WORLD=$((PER_NODE*NODES))
PRECISION="bf16"
ARGS=(
    --tensor-model-parallel-size 4   # a comment (with parentheses)
)
ARGS+=("--micro-batch-size 2")
if [[ "$PRECISION" == "fp8" ]]; then
    ARGS+=(--fp8-format hybrid)
elif [ "$PRECISION" = "bf16" ]; then
    ARGS+=(--bf16)
else
    ARGS+=(--fp16)
fi
if some_command; then ARGS+=(--seed 1); fi
torchrun --nproc_per_node $PER_NODE --nnodes $NODES pretrain_gpt.py ${ARGS[@]} \\
    --world $WORLD
"""
    read = command_words(script)
    assert read.words == ["--tensor-model-parallel-size", "4", "--micro-batch-size", "2", "--bf16", "--seed", "1",
                          "--world", "16"]
    assert read.script == "pretrain_gpt.py" and read.launcher[-4:] == ["--nproc_per_node", "8", "--nnodes", "2"]
    assert read.unsure == ["the condition 'some_command' (its branch was read)"]


def test_megatron_interleaved_and_block_recompute(tmp_path):
    """--num-layers-per-virtual-pipeline-stage 4 on 80 layers / PP 4 is 5 virtual stages per GPU;
    --recompute-method block --recompute-num-layers 3 recomputes 3 layers per virtual stage."""
    f = tmp_path / "args.sh"
    f.write_text("--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --group-query-attention "
                 "--num-query-groups 8 --ffn-hidden-size 28672 --swiglu --normalization RMSNorm "
                 "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear "
                 "--max-position-embeddings 8192 --seq-length 8192 --tensor-model-parallel-size 8 "
                 "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4 --sequence-parallel "
                 "--micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer "
                 "--recompute-granularity full --recompute-method block --recompute-num-layers 3\n")
    imp = read_config(f)
    assert imp.options["model"] == "llama-3-70b"
    want = plan(model="llama-3-70b", framework="megatron", gpus=64, tp=8, pp=4, sp=True, schedule="interleaved", vpp=5,
                mbs=1, gbs=64, seq_len=8192, zero=1, recompute="full", recompute_layers=3, overlap_dp=False,
                dropout=0.1)
    same_plan(plan(from_file=str(f), gpus=64), want)


@pytest.mark.parametrize("name, text, field", [
    ("job.toml", "[model\nname = 1", "from"),
    ("job.toml", '[model]\nname = "llama3"\nflavor = "7B"\n', "from.model.flavor"),
    ("job.toml", '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 0\n',
     "from.training.local_batch_size"),
    ("job.toml", '[model]\nname = "llama3"\nflavor = "8B"\n[optimizer]\nname = "Muon"\n', "from.optimizer.name"),
    ("job.toml", '[model]\nname = "llama3"\nflavor = "8B"\nnorm_type = "layernorm"\n', "from.model.norm_type"),
    ("run.sh", "echo hello\n", "from"),
    ("run.sh", "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --vocab-size 32000 --normalization Foo\n",
     "from.normalization"),
    ("run.sh", "--num-layers x\n", "from.num-layers"),
])
def test_bad_files_are_one_error(tmp_path, name, text, field):
    f = tmp_path / name
    f.write_text(text)
    res = RUNNER.invoke(app, ["plan", "--from", str(f)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert res.stderr.startswith(f"error: {field}:"), res.stderr


def test_torchtitan_ac_every_nth_layer(tmp_path):
    """selective_ac_option = "2" (earlier torchtitan): every second block checkpointed whole, 16
    of Llama 3.1 8B's 32 layers: planned as full recompute of 16 layers."""
    f = tmp_path / "job.toml"
    f.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nseq_len = 4096\n'
                 '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n')
    got = plan(from_file=str(f), gpus=8)
    want = plan(model="llama-3.1-8b", framework="fsdp", gpus=8, zero=3, mbs=2, gbs=16, seq_len=4096, recompute="full",
                recompute_layers=16)
    same_plan(got, want)


def test_megatron_model_named_alongside(data_dir):
    """--model beside a script replaces its model: its model flags are said to be replaced, the
    layout and batch still the script's (here the Llama 3 8B FP8 script run with Mistral 7B)."""
    f = data_dir / "imports/megatron_train_llama3_8b_h100_fp8.sh"
    imp = read_config(f, model_given=True)
    assert "model" not in imp.options and not [u for u in imp.unknown if u.startswith("--num-")]
    assert any(n.startswith("the model named alongside replaces the file's: --hidden-size, --ffn-hidden-size")
               for n in imp.notes)
    got = plan(from_file=str(f), model="mistral-7b")
    assert (got["model"]["name"], got["parallel"]["gbs"], got["parallel"]["seq_len"]) == ("mistral-7b", 128, 8192)


def test_cli_from_equals_cli_options(data_dir):
    """On the command line: `plan --from FILE --gpus 64 --json` prints what the same settings
    given as options print (Megatron-LM's Mixtral 8x7B example)."""
    f = str(data_dir / "imports/megatron_train_mixtral_8x7b_distributed.sh")
    a = RUNNER.invoke(app, ["plan", "--from", f, "--gpus", "64", "--json"])
    b = RUNNER.invoke(app, ["plan", "--model", "mixtral-8x7b", "--framework", "megatron", "--gpus", "64", "--pp", "4",
                            "--ep", "8", "--sp", "--mbs", "1", "--gbs", "256", "--seq-len", "4096", "--zero", "1",
                            "--dropout", "0", "--json"])
    assert a.exit_code == b.exit_code == 0, a.output + b.output
    got = json.loads(a.stdout)
    assert got.pop("import")["format"] == "megatron"
    assert json.dumps(got, sort_keys=True) == json.dumps(json.loads(b.stdout), sort_keys=True)


def test_import_defaults_name_catalog_models():
    """catalog/imports.toml: every torchtitan flavor maps to a catalog model, and the tokenizer
    vocabularies are the catalog's GPT-2 and Llama 2 ones."""
    from trainplan.imports import defaults
    from trainplan.specs import catalog

    d = defaults()
    assert all(catalog.model(name) for name in d["torchtitan"]["flavors"].values())
    vocab = d["megatron"]["tokenizer_vocab"]
    assert (vocab["GPT2BPETokenizer"], vocab["Llama2Tokenizer"]) == (catalog.model("gpt2").vocab,
                                                                      catalog.model("llama-2-7b").vocab)
    assert all(t.get("source") for t in (d["megatron"], d["deepspeed"], d["torchtitan"], d["megatron"]["tokenizer_vocab"]))


def test_megatron_deepseek_v3_megatron_fsdp(data_dir, tmp_path):
    """examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh: its flags describe the catalog's
    DeepSeek-V3 exactly (MLA ranks, 256 routed experts of 2,048 plus a shared one, the first 3
    layers dense, the expert bias), but it trains a multi-token-prediction layer too, which
    trainplan does not model: refused by name. Named alongside, the model is planned with the
    script's run: Megatron-FSDP optim_grads_params (ZeRO-3) with EP 8, gradients kept and reduced
    in bf16, MLA up-projections and norms recomputed."""
    f = data_dir / "imports/megatron_sbatch_mfsdp_deepseek_v3.sh"
    with pytest.raises(PlanError) as err:
        read_config(f)
    assert err.value.field == "from.mtp-num-layers"
    no_mtp = tmp_path / "no_mtp.sh"
    no_mtp.write_text(f.read_text().replace("--mtp-num-layers 1", ""))
    assert read_config(no_mtp).options["model"] == "deepseek-v3"
    imp = read_config(f, model_given=True)
    assert "--recompute-modules mlp" in imp.unknown and "--recompute-modules moe" in imp.unknown
    want = plan(model="deepseek-v3", framework="megatron", gpus=256, tp=1, cp=1, ep=8, sp=True, mbs=4, gbs=2048,
                seq_len=4096, zero=3, grad_dtype="bf16", reduce_dtype="bf16", recompute="selective",
                recompute_modules="mla_up_proj,layernorm", overlap_dp=True, dropout=0.0)
    same_plan(plan(from_file=str(f), model="deepseek-v3", gpus=256), want)


def test_megatron_settings_file_without_command(data_dir):
    """examples/post_training/modelopt/conf/Qwen/Qwen3-30B-A3B.sh sets MODEL_ARGS for a launcher
    to source: its flags describe the catalog's Qwen3-30B-A3B (128 experts of 768, top 8, QK norm)."""
    imp = read_config(data_dir / "imports/megatron_modelopt_Qwen3-30B-A3B.sh")
    assert imp.options["model"] == "qwen3-30b-a3b"
    assert imp.notes[0] == "no training command: read the flags of $MODEL_ARGS"
    assert (imp.options["mbs"], imp.options["precision"], imp.options["seq_len"]) == (1, "bf16", 4096)


def test_torchtitan_deepseek_v3_job(data_dir):
    """torchtitan's DeepSeek-V3 671B TOML job: FSDP over all ranks, local batch 4 of 4,096 tokens;
    per-op selective checkpointing is modelled for dense layers only, so it is planned (and said)
    as Megatron's selective recompute; compile covers the loss only, so no fused kernels; the
    float8 recipe's sections are read and not planned (no converter enables them)."""
    f = data_dir / "imports/torchtitan_deepseek_v3_671b.toml"
    imp = read_config(f)
    assert "[quantize]" in imp.ignored and not imp.unknown
    assert any("planned as Megatron's selective recompute" in n for n in imp.notes)
    want = plan(model="deepseek-v3", framework="fsdp", gpus=256, zero=3, mbs=4, gbs=1024, seq_len=4096,
                recompute="selective")
    same_plan(plan(from_file=str(f), gpus=256), want)


def test_torchtitan_command_names_python_names(tmp_path):
    from trainplan.imports import read_text

    with pytest.raises(PlanError) as err:
        read_text("--module 'a;b' --config x\n", "run.sh")
    assert err.value.field == "from.module"


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="needs the frameworks extra (torchtitan)")
def test_torchtitan_command_names_config_functions_only(tmp_path):
    """--module/--config name a config function of a config module: a function the module
    imported from elsewhere, or any module but torchtitan's for untrusted text, is refused."""
    from trainplan.imports import read_text

    with pytest.raises(PlanError) as err:
        read_text("torchrun -m torchtitan.train --module os --config getcwd\n", "run.sh")
    assert err.value.field == "from.config"
    with pytest.raises(PlanError) as err:
        read_text("torchrun -m torchtitan.train --module json --config dumps\n", "run.sh", trusted=False)
    assert err.value.field == "from.module"


def test_script_arithmetic_is_bashs_and_bounded():
    """$((...)) as bash computes it (64-bit integers, division truncating toward zero, % with the
    dividend's sign), evaluated without eval: a power tower is refused at once, not computed."""
    from trainplan.imports.shell import arithmetic

    assert arithmetic("8 * 4 + 2") == 34 and arithmetic("(2+3)*4 % 7") == 6
    assert arithmetic("-7/2") == -3 and arithmetic("-7%2") == -1
    assert arithmetic("9223372036854775806/3") == 3074457345618258602
    assert arithmetic("2**62") == 2**62
    for bad in ("9**9**9**9", "2**63", "1/0", "3 4", "()"):
        assert arithmetic(bad) is None, bad
