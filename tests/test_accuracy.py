"""The time model against published runs (benchmarks/data/published_runs.toml, each table
citing its source; docs/accuracy.md is generated from the same rows)."""

from pathlib import Path

import numpy as np
import pytest

from trainplan.calibration import megatron_model_flops, palm_model_flops, rows
from trainplan.estimate.flops import step_flops
from trainplan.specs import catalog
from trainplan.specs.model import ModelSpec

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.toml"


@pytest.fixture(scope="module")
def published():
    return rows(DATA)


def errors(published, source):
    return np.array([r["predicted"] / r["published"] - 1 for r in published if r["source"] == source])


def test_narayanan_table_within_target(published):
    """Narayanan et al. 2021 Table 1 (A100, the table the training ratio is fitted on): mean
    absolute error <= 5%, worst <= 10% (docs/accuracy.md: 3.0% / 8.5%)."""
    e = np.abs(errors(published, "narayanan2021"))
    assert len(e) == 10 and e.mean() <= 0.05 and e.max() <= 0.10


def test_held_out_megatron_v1_v2_iteration_times(published):
    """Megatron-LM v1/v2 GPT-2 iteration times (V100/A100, held out): 3.5% mean, 6.1% worst in
    docs/accuracy.md, within the target of 5% / 10% that this test holds."""
    e = np.abs(errors(published, "megatron_single_node"))
    assert len(e) == 12 and e.mean() <= 0.05 and e.max() <= 0.10


def test_llama3_data_parallel_scaling(published):
    """Llama 3 405B, 8K context (paper Table 4): doubling data parallelism from 8,192 to 16,384
    GPUs at a fixed 16M-token batch halves the micro-batches per pipeline and drops the
    TFLOP/s per GPU from 430 to 400 (-7.0%); the model, on the paper's one-layer virtual
    stages, reproduces the drop within 2 percentage points."""
    llama = [r for r in published if r["source"] == "llama3_405b"]
    published_drop = llama[1]["published"] / llama[0]["published"] - 1
    predicted_drop = llama[1]["predicted"] / llama[0]["predicted"] - 1
    assert published_drop == pytest.approx(-0.07, abs=0.001)
    assert predicted_drop == pytest.approx(published_drop, abs=0.02)


@pytest.mark.parametrize("h,a,L", [(2048, 16, 24), (7168, 56, 48)])
def test_megatron_count_is_num_floating_point_operations(h, a, L):
    """Megatron-LM training.py num_floating_point_operations for a GPT (MHA, GELU MLP 4h):
    12·B·s·L·h²·((1 + g/a + s/h) + f/h + V/(2Lh)) with g = a and V the padded vocabulary
    (Megatron-Core weak-scaling rows: s = 4096, V = 131,072)."""
    B, s, V = 4, 4096, 131072
    gpt = ModelSpec(name="gpt", source="test", layers=L, hidden=h, heads=a, ffn=4 * h, mlp="gelu", vocab=V,
                    tied_embeddings=True, norm="layernorm", position="learned", max_position=s, fused_qkv=True)
    expected = 12 * B * s * L * h * h * ((1 + 1 + s / h) + 4 + V / (2 * L * h))
    assert megatron_model_flops(gpt, tokens=B * s, seq=s, vocab_padded=V) == pytest.approx(expected, rel=1e-12)


def test_palm_count_for_llama3_405b():
    """PaLM's 6N + 12·L·H·Q·T (Llama 3's MFU numerator) equals the materialised-attention count
    (every backward twice its forward, scores over the whole sequence) plus 6 FLOPs for each
    parameter no matmul reads (input embedding, norms); at 8K context the attention term is
    12·126·16384·8192 = 2.03e11 FLOPs per token, 8.3% of 6N."""
    m = catalog.model("llama-3.1-405b")
    s = 8192
    palm = palm_model_flops(m, tokens=s, seq=s)
    ours = float(step_flops(m, tokens=s, seq=s, dense_layers=m.layers, moe_layers=0, head=1, attention_eager=True,
                            recompute=0)["model"])
    no_matmul = m.embedding_params + m.layers * 2 * m.hidden + m.hidden  # embedding table, 2 RMSNorms per layer, final
    assert palm == pytest.approx(ours + 6 * no_matmul * s, rel=1e-12)
    assert 12 * m.layers * m.q_dim * s / (6 * m.params) == pytest.approx(0.083, abs=0.001)


def test_hopper_flash_attention_default_is_fa2_causal_forward_backward():
    """The H100 FlashAttention figures are FA2's causal forward + backward at head dim 128
    (Shah et al. 2024, Figs. 5-6, H100 SXM5, 512..16k): causal forward 191..335 TFLOP/s
    (non-causal 309..370), backward 214..322 non-causal scaled by the forward's causal ratio;
    the backward does 2.5x the forward's FLOPs. At 4k: 3.5 / (1/319 + 2.5/269) = 281 TFLOP/s =
    28% of 989.4. Every point of the catalog curve, and the single figure, follow from them."""
    from trainplan.plan import conventions

    eff = conventions()["efficiency"]
    causal_fwd = np.array([191, 260, 298, 319, 333, 335])
    noncausal_fwd = np.array([309, 350, 362, 368, 370, 370])
    noncausal_bwd = np.array([214, 260, 291, 310, 318, 322])
    fwd_bwd = 3.5 / (1 / causal_fwd + 2.5 / (noncausal_bwd * causal_fwd / noncausal_fwd))
    assert fwd_bwd[3] == pytest.approx(281, abs=1)
    curve = eff["flash_attention_curve"]["H100-SXM"]
    assert curve["seq"] == [512, 1024, 2048, 4096, 8192, 16384]
    assert curve["fraction"] == pytest.approx(fwd_bwd / 989.4, abs=0.0006)  # rounded to 3 places
    assert eff["flash_attention"]["H100-SXM"] == pytest.approx(fwd_bwd[3] / 989.4, abs=0.005)


def test_hopper_cudnn_attention_is_the_published_causal_forward_backward():
    """cuDNN attention on H100, head dim 128 (Shah et al. 2024, Figs. 5-6, cuDNN bars): causal
    forward 315..539 TFLOP/s, non-causal forward 497..595, non-causal backward 305..516; the
    curve follows from them as FA2's does: 447.5 TFLOP/s at 4k (45.2% of 989.4), 1.59x FA2.
    A plan that asks for it on H100 spends that much less on attention; elsewhere (no published
    figure) it is priced as FA2 and says so."""
    from trainplan.estimate.attention_rates import flash_efficiency
    from trainplan.estimate.hardware import hardware
    from trainplan.plan import conventions, make_plan, resolve

    causal_fwd = np.array([315, 410, 484, 518, 529, 539])
    noncausal_fwd = np.array([497, 574, 617, 609, 600, 595])
    noncausal_bwd = np.array([305, 408, 465, 499, 518, 516])
    fwd_bwd = 3.5 / (1 / causal_fwd + 2.5 / (noncausal_bwd * causal_fwd / noncausal_fwd))
    assert fwd_bwd[3] == pytest.approx(447.5, abs=0.5)
    curve = conventions()["efficiency"]["cudnn_attention_curve"]["H100-SXM"]
    assert curve["seq"] == [512, 1024, 2048, 4096, 8192, 16384]
    assert curve["fraction"] == pytest.approx(fwd_bwd / 989.4, abs=0.0006)  # rounded to 3 places

    def hw(gpu, attention):
        return hardware(resolve(make_plan(model="llama-3-8b", gpu=gpu, gpus=8, attention=attention)))

    assert float(flash_efficiency(hw("H100-SXM", "cudnn"), 4096)) / float(
        flash_efficiency(hw("H100-SXM", "flash"), 4096)) == pytest.approx(447.5 / 281, rel=0.01)
    a100 = resolve(make_plan(model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8, attention="cudnn"))
    assert [w["code"] for w in a100.warning_details] == ["cudnn_unpublished"]
    assert float(flash_efficiency(hw("A100-80GB-SXM", "cudnn"), 4096)) == float(
        flash_efficiency(hw("A100-80GB-SXM", "flash"), 4096))


def test_h100_tables_do_not_regress(published):
    """H100 (docs/accuracy.md): Megatron-Core (the table Hopper's GEMM ratio is fitted on)
    7.6% mean; held out, Llama 3 405B 3.8%, MosaicML 6.9%, MosaicML's whole H100 BF16 table
    (52 rows) 6.1% and its large-scale table (18 rows, 128-512 GPUs) 3.7%, 14.1% worst (3.9% and
    12.7% while collectives were priced as one Simple ring at the NIC's bandwidth; 4.5% and 14.9%
    with NCCL's LL128 across nodes, as NCCL 2.18 runs it, and the gradients reduced in bf16).
    Bounds one point above; the large-scale table's mean at most the 3.87% it had before NCCL's
    protocols were priced."""
    for source, bound in (("megatron_core_h100", 0.086), ("llama3_405b", 0.048), ("mosaicml_h100", 0.080),
                          ("mosaicml_h100_full", 0.072), ("mosaicml_h100_large", 0.0387)):
        assert np.abs(errors(published, source)).mean() <= bound, source
    assert np.abs(errors(published, "mosaicml_h100_large")).max() <= 0.151


def test_mosaicml_large_scale_rows_reduce_in_fp32(published):
    """The large-scale H100 table's MP Mode column is DEFAULT, and the llm-foundry commit that
    published it (5e85bd62d, January 2024) pins Composer >=0.17.2, whose DEFAULT sets FSDP's
    reduce_dtype to float32: its rows reduce-scatter fp32 gradients, twice the 2023 tables' bf16
    bytes. On MPT-1b over 512 GPUs (24 blocks and the root, 25 calls a pass) the reduce-scatter
    then carries 4 bytes a parameter, its calls at the same latency, NCCL's ring with LL128."""
    import tomllib

    from trainplan.calibration import mosaicml_setup
    from trainplan.estimate.time import step_derivation
    from trainplan.plan import make_plan, resolve

    data = tomllib.loads(DATA.read_text())
    assert {mosaicml_setup(data["mosaicml_h100_large"], row)[1]["reduce_dtype"]
            for row in data["mosaicml_h100_large"]["rows"]} == {"fp32"}
    assert {mosaicml_setup(data[t], row)[1]["reduce_dtype"] for t in ("mosaicml_h100_full", "mosaicml_a100_full",
                                                                       "mosaicml_h100_fp8") for row in data[t]["rows"]} == {"bf16"}
    row = next(r for r in data["mosaicml_h100_large"]["rows"] if r[0] == "1b" and r[5] == 512)
    spec, kw = mosaicml_setup(data["mosaicml_h100_large"], row)
    d = {dt: step_derivation(resolve(make_plan(**{**kw, "reduce_dtype": dt}), spec)) for dt in ("fp32", "bf16")}
    wire = {dt: float(x["dp_collectives_s"]["reduce_scatter"]) - 25 * float(x["dp_call_latency_s"]["reduce_scatter"])
            for dt, x in d.items()}
    assert [x["nccl_algorithms"]["DP reduce-scatter"] for x in d.values()] == ["ring/LL128"] * 2
    assert float(d["fp32"]["dp_call_latency_s"]["reduce_scatter"]) == float(d["bf16"]["dp_call_latency_s"]["reduce_scatter"])
    assert wire["fp32"] == pytest.approx(2 * wire["bf16"], rel=1e-9)
    e = {r["label"]: r["predicted"] / r["published"] - 1 for r in published if r["source"] == "mosaicml_h100_large"}
    assert e["MPT-1b, s 2048, 512 GPUs, mb 12, SHARD_GRAD_OP"] == pytest.approx(0.141, abs=0.002)


def test_held_out_mosaicml_a100_rows(published):
    """MosaicML's A100 80GB rows (held out; every MPT size from 125M to 30B at sequence 2,048
    and at its longest, up to 65,536, FSDP, FlashAttention in Triton): 5.7% mean, 27.7% worst
    (MPT-30B at 8K) in docs/accuracy.md; bounds one point above. With FlashAttention-2 in
    place of the Triton kernel the rows at 32K-64K tokens would be predicted 29-84% too fast."""
    e = np.abs(errors(published, "mosaicml_a100"))
    assert len(e) == 16 and e.mean() <= 0.067 and e.max() <= 0.287
    # the whole amp_bf16 table (59 runs, 512 to 65,536 tokens): 5.4% mean, the same worst row
    e = np.abs(errors(published, "mosaicml_a100_full"))
    assert len(e) == 59 and e.mean() <= 0.064 and e.max() <= 0.287

    import tomllib

    from trainplan.calibration import _compare

    table = tomllib.loads(DATA.read_text())["mosaicml_a100"]
    longest = [row for row in table["rows"] if row[4] >= 32768]
    with_fa2 = [_compare("mosaicml_a100", table, row, {}, attention="flash") for row in longest]
    too_fast = [r["predicted"] / r["published"] - 1 for r in with_fa2]
    assert len(too_fast) == 7 and min(too_fast) == pytest.approx(0.29, abs=0.02) and max(too_fast) == pytest.approx(
        0.84, abs=0.02)


def test_triton_flash_attention_is_its_published_share_of_fa2():
    """FlashAttention in Triton (OpenAI's triton.ops kernel, the published proxy for MPT's)
    against FA2, forward + backward, causal, head dim 128, on one A100 (Dao 2023, Fig. 4d):
    28/61/74/80/83/92 against 99/131/155/182/189/189 TFLOP/s at 512..16k. The catalog's ratio is their quotient, the A100 FA2 curve is FA2's figures over
    312 TFLOP/s, and so a Triton plan on an A100 runs at the Triton figures themselves."""
    from trainplan.estimate.attention_rates import flash_efficiency
    from trainplan.estimate.hardware import hardware
    from trainplan.plan import conventions, make_plan, resolve

    triton = np.array([28, 61, 74, 80, 83, 92])
    fa2 = np.array([99, 131, 155, 182, 189, 189])
    eff = conventions()["efficiency"]
    assert eff["flash_attention_triton"]["ratio"] == pytest.approx(triton / fa2, abs=0.0006)
    assert eff["flash_attention_curve"]["A100-80GB-SXM"]["fraction"] == pytest.approx(fa2 / 312, abs=0.0006)
    seq = np.array(eff["flash_attention_triton"]["seq"])
    kw = dict(model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8)
    a100 = hardware(resolve(make_plan(**kw, attention="triton")))
    assert flash_efficiency(a100, seq) * 312 == pytest.approx(triton, abs=0.5)
    # the same ratio on Hopper: both kernels issue Ampere mma instructions
    h100_fa2, h100_triton = (flash_efficiency(hardware(resolve(make_plan(**{**kw, "gpu": "H100-SXM"}, attention=a))), seq)
                             for a in ("flash", "triton"))
    assert h100_triton == pytest.approx(h100_fa2 * triton / fa2, abs=0.0005)


def test_triton_flash_attention_forward_runs_at_its_published_forward_speed():
    """The Triton kernel's forward alone, causal, head dim 128, on the same A100 (Dao 2023,
    Fig. 5d): 63/70/115/115/111/111 TFLOP/s at 512..16k. A Triton plan on an A100 prices a
    forward (and a recomputed one) at those figures and the backward at the rest of the
    forward + backward total (Fig. 4d): from 2k the backward is the slower part (71 TFLOP/s at
    4k), as the paper says (FA2 is 1.3-1.5x the Triton kernel in the forward, about 2x in the
    backward)."""
    from trainplan.estimate.attention_rates import flash_efficiency
    from trainplan.estimate.hardware import hardware
    from trainplan.plan import make_plan, resolve

    forward = np.array([63, 70, 115, 115, 111, 111])
    both = np.array([28, 61, 74, 80, 83, 92])
    seq = np.array([512, 1024, 2048, 4096, 8192, 16384])
    a100 = hardware(resolve(make_plan(model="llama-3-8b", gpu="A100-80GB-SXM", gpus=8, attention="triton")))
    assert flash_efficiency(a100, seq, forward=True) * 312 == pytest.approx(forward, abs=0.5)
    backward = 2.5 / (3.5 / both - 1 / forward)  # TFLOP/s of the rest of the total
    assert np.all(backward[2:] < forward[2:]) and backward[3] == pytest.approx(71.4, abs=0.5)


def test_hopper_fa2_curve_agrees_with_fa2_papers_own_h100_figure():
    """Cross-check of the H100 curve (derived from Shah et al. 2024 Figs. 5-6) against FA2's own
    H100 forward + backward figure (Dao 2023, Fig. 7d, causal, head dim 128): 163/221/265/294/
    308/328 TFLOP/s at 512..16k, i.e. 0.165..0.332 of 989.4; every point within 0.03."""
    from trainplan.plan import conventions

    curve = conventions()["efficiency"]["flash_attention_curve"]["H100-SXM"]
    assert curve["fraction"] == pytest.approx(np.array([163, 221, 265, 294, 308, 328]) / 989.4, abs=0.03)


def test_every_published_mosaicml_run_fits_in_80_gb():
    """Each MosaicML row ran on an 80 GB GPU, so the memory model must fit it. MPT's loss is
    flash-attn's fused cross-entropy (llm-foundry's loss_fn default), which keeps the bf16
    logits; with PyTorch's fp32 loss the memory model would put 6 of the 25 runs over 80 GiB
    (up to 92 GiB, MPT-350M at 65,536 tokens per micro-batch)."""
    import tomllib

    from trainplan.calibration import mosaicml_setup
    from trainplan.estimate.memory import estimate_memory
    from trainplan.plan import make_plan, resolve

    data = tomllib.loads(DATA.read_text())
    peaks = {True: [], False: []}
    for table in ("mosaicml_h100", "mosaicml_a100"):
        for row in data[table]["rows"]:
            spec, kw = mosaicml_setup(data[table], row)
            for fused in (True, False):
                layout = resolve(make_plan(**{**kw, "fused_loss": fused}), spec)
                peaks[fused].append(np.max(estimate_memory(layout)["total"]) / layout.gpu.capacity_bytes)
    assert len(peaks[True]) == 25 and max(peaks[True]) <= 1.0
    assert sum(p > 1.0 for p in peaks[False]) == 6
    # the whole H100 BF16 and A100 amp_bf16 tables: all 52 and 59 runs fit, the fullest MPT-3B at
    # 8K tokens x 3 (75.3 GiB); the 18 large-scale H100 runs too (the fullest MPT-7B on 128 GPUs,
    # 56.6 GiB with a block's unsharded gradient cast to fp32 for its reduce-scatter; the
    # SHARD_GRAD_OP runs keep the bf16 model gathered beside fp32 shards, up to 52.5 GiB)
    for name, count, fullest in (("mosaicml_h100_full", 52, 75.3), ("mosaicml_a100_full", 59, 75.3),
                                 ("mosaicml_h100_large", 18, 56.6)):
        table = data[name]
        full = [np.max(estimate_memory(layout := resolve(make_plan(**kw), spec))["total"]) / layout.gpu.capacity_bytes
                for spec, kw in (mosaicml_setup(table, row) for row in table["rows"])]
        assert len(full) == count and max(full) == pytest.approx(fullest / 80, abs=0.002)


def test_held_out_mosaicml_h100_fp8_rows(published):
    """MosaicML's H100 FP8 table (held out; Transformer Engine fp8 linear layers, 350M-3B, 512 to
    32,768 tokens): 5.5% mean, 10.1% worst in docs/accuracy.md; bounds one point above. fp8
    recipes keep attention and the head 16-bit: MPT-3B at 32K tokens ran 5,856 tokens/s per GPU
    in fp8 and 5,873 in bf16 (attention-bound), and the model puts the two within 10% of each
    other (priced at the fp8 peak, attention made the fp8 run 1.9x faster)."""
    import tomllib

    from trainplan.calibration import _compare

    e = np.abs(errors(published, "mosaicml_h100_fp8"))
    assert len(e) == 10 and e.mean() <= 0.065 and e.max() <= 0.111
    data = tomllib.loads(DATA.read_text())
    fp8 = _compare("mosaicml_h100_fp8", data["mosaicml_h100_fp8"], data["mosaicml_h100_fp8"]["rows"][0], {})
    bf16_row = next(r for r in data["mosaicml_h100_full"]["rows"] if r[0] == "3b" and r[4] == 32768)
    bf16 = _compare("mosaicml_h100_full", data["mosaicml_h100_full"], bf16_row, {})
    assert (fp8["published"], bf16["published"]) == (5856, 5873)
    assert fp8["predicted"] / bf16["predicted"] == pytest.approx(1.0, abs=0.10)


def test_held_out_nemo_automodel_h100_rows(published):
    """NeMo AutoModel's H100 BF16 pre-training table (held out; FSDP2 as its benchmark configs
    and the code they run through set it): Qwen3-30B-A3B with 8-way expert parallelism, 12,040
    tokens/s per GPU published, and Llama 3.1 70B with 2-way context parallelism, 866.77;
    docs/accuracy.md: +0.9% and -3.8%, bounds one point above. Each published throughput is the
    table's own global batch x sequence / step time / GPUs. Both models are built in bf16 and
    train without an fp32 master copy; so priced, both fit in 80 GB, and the MoE run would not
    with mixed precision's fp32 weights, gradients and Adam state (88.6 GiB)."""
    import tomllib

    from trainplan.calibration import automodel_setup
    from trainplan.estimate.memory import estimate_memory
    from trainplan.plan import make_plan, resolve

    e = errors(published, "automodel_h100")
    assert len(e) == 2 and np.abs(e).mean() <= 0.034 and np.abs(e).max() <= 0.048
    assert [r["moe"] for r in published if r["source"] == "automodel_h100"] == [True, False]
    cfg = tomllib.loads(DATA.read_text())["automodel_h100"]
    for row in cfg["rows"]:
        layout = resolve(make_plan(**automodel_setup(cfg, row)))
        assert layout.gbs * layout.seq_len / row[-2] / layout.gpus == pytest.approx(row[-1], rel=1e-3)
    for row in cfg["rows"]:
        layout = resolve(make_plan(**automodel_setup(cfg, row)))
        assert np.max(estimate_memory(layout)["total"]) <= layout.gpu.capacity_bytes, row[0]
    mixed = resolve(make_plan(**{**automodel_setup(cfg, cfg["rows"][0]), "master_weights": True,
                                 "optimizer_state_dtype": None}))
    assert np.max(estimate_memory(mixed)["total"]) / 2**30 == pytest.approx(88.6, abs=0.1)


def test_plans_report_the_error_of_the_published_runs_behind_them(published):
    """`plan` reports beside its step time how far the published comparison says to trust it:
    catalog/accuracy.toml, written by scripts/accuracy_report.py, holds each accelerator's runs
    (each counted once: 94 on H100, 74 on A100 80GB, of which 9 and 10 in the tables the training
    ratios are fitted on) and their mean and worst absolute error,
    the same figures docs/accuracy.md shows. H200 and H800 take the H100's efficiency defaults
    and report its runs; an accelerator without its own measured defaults, or with no compared
    runs, reports none, and a plan priced from a profile says so."""
    from trainplan.calibration import errors_by_gpu
    from trainplan.estimate.accuracy import prediction_accuracy, published_errors
    from trainplan.plan import make_plan
    from trainplan.report import evaluate, to_json

    assert published_errors() == errors_by_gpu(published)  # regenerate: scripts/accuracy_report.py
    from trainplan.calibration import readme_accuracy_summary

    readme = (DATA.parents[2] / "README.md").read_text()
    assert "<!-- BEGIN accuracy-summary -->\n" + readme_accuracy_summary(published) + "\n<!-- END" in readme
    h100 = published_errors()["H100-SXM"]
    # (A100: Narayanan et al., MosaicML's whole table, BLOOM, OPT, DeepSpeed on Azure; torchtitan's 500 W HBM2e H100s are
    # another part than the H100 SXM and not counted for it)
    assert h100["runs"] == 9 + 52 + 18 + 10 + 3 + 2 and published_errors()["A100-80GB-SXM"]["runs"] == 10 + 59 + 1 + 1 + 3
    assert h100["moe_runs"] == 1 and published_errors()["A100-80GB-SXM"]["moe_runs"] == 0
    assert h100["fitted_runs"] == 9 and published_errors()["A100-80GB-SXM"]["fitted_runs"] == 10
    assert h100["mean_abs_error"] == pytest.approx(np.mean(np.abs(
        [r["predicted"] / r["published"] - 1 for r in published
         if r["gpu"] == "H100-SXM" and r["source"] not in ("mosaicml_h100", "torchtitan_h100")])), abs=1e-4)
    for gpu in ("H200-SXM", "H800-SXM"):
        assert prediction_accuracy(gpu) == {"compared_on": "H100-SXM", "basis": "shared defaults", **h100}
    for gpu in ("B200", "A100-PCIe-80GB", "L4", "MI300X"):
        assert prediction_accuracy(gpu) == {"compared_on": None, "basis": "none"}
    assert prediction_accuracy("H100-SXM", profiled=True)["basis"] == "profile"
    out = to_json(evaluate(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8)))
    assert out["time"]["accuracy"] == {"compared_on": "H100-SXM", "basis": "published runs", **h100}
    # every published run trains in full, one H100 run is a mixture of experts, none on A100: a
    # LoRA plan, or a MoE plan without a published MoE run, says what is not covered
    from trainplan.render import accuracy_sentence

    moe = to_json(evaluate(make_plan(model="mixtral-8x7b", gpu="H100-SXM", gpus=64, ep=8, zero=1)))
    assert "beyond" not in moe["time"]["accuracy"] and moe["time"]["accuracy"]["runs"] == h100["runs"]
    assert accuracy_sentence(moe["time"]["accuracy"], "H100-SXM").endswith("; 1 of them a mixture of experts")
    moe_a100 = to_json(evaluate(make_plan(model="mixtral-8x7b", gpu="A100-80GB-SXM", gpus=64, ep=8, zero=1)))
    assert moe_a100["time"]["accuracy"]["beyond"] == ["moe"]
    assert accuracy_sentence(moe_a100["time"]["accuracy"], "A100-80GB-SXM").endswith(
        "the published runs are dense models trained in full, not mixture of experts")
    lora = to_json(evaluate(make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=1, finetune="lora")))
    assert lora["time"]["accuracy"]["beyond"] == ["lora"] and "beyond" not in out["time"]["accuracy"]
    # the catalog listing carries the same figures per accelerator
    import json

    from typer.testing import CliRunner

    from trainplan.cli import app

    listing = {g["name"]: g["accuracy"] for g in json.loads(CliRunner().invoke(app, ["gpus", "--json"]).output)}
    assert listing["H800-SXM"]["compared_on"] == "H100-SXM" and listing["MI300X"]["compared_on"] is None


def test_auto_attention_is_the_kernel_the_framework_runs():
    """`--attention auto`, the default, prices the kernel the framework runs: Transformer Engine
    (Megatron-Core) prefers cuDNN's fused attention on Hopper, so a Megatron plan on H100, H200
    or H800 gets cuDNN (447.5 against FA2's 281 TFLOP/s at 4k) without a warning; elsewhere, and
    under the other frameworks, FlashAttention-2. An explicit choice is kept (FA2 under
    Megatron on Hopper is warned), and an unknown accelerator is still refused by name."""
    from trainplan.errors import PlanError
    from trainplan.plan import make_plan, resolve

    for gpu in ("H100-SXM", "H200-SXM", "H800-SXM"):
        plan = make_plan(model="llama-3-8b", gpu=gpu, gpus=8, framework="megatron")
        assert plan.attention == "cudnn" and not resolve(plan).warnings
    for framework, gpu in (("deepspeed", "H100-SXM"), ("fsdp", "H100-SXM"), ("megatron", "A100-80GB-SXM"),
                           ("megatron", "B200")):
        assert make_plan(model="llama-3-8b", gpu=gpu, gpus=8, framework=framework).attention == "flash"
    explicit = make_plan(model="llama-3-8b", gpu="H100-SXM", gpus=8, framework="megatron", attention="flash")
    assert explicit.attention == "flash" and resolve(explicit).warning_details[0]["code"] == "megatron_cudnn"
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpu="H1000", gpus=8, framework="megatron"))
    assert e.value.field == "gpu"


def test_new_held_out_tables_cite_their_sources():
    """The BLOOM, OPT, DeepSpeed-on-Azure and torchtitan tables: every row present with its published figure, each
    table citing its source, none of them a table a training ratio is fitted on."""
    import tomllib

    from trainplan.calibration import FITTED, OTHER_PARTS

    data = tomllib.loads(DATA.read_text())
    bloom, opt, titan = data["bloom_176b"], data["opt_175b"], data["torchtitan_h100"]
    assert "train/tr11-176B-ml/README.md" in bloom["source"] and "104.70" in bloom["source"]
    assert "2211.05100" in bloom["source"] and "tr11-176B-ml.slurm" in bloom["source"]
    assert bloom["rows"] == [["BLOOM 176B, iteration 85,376", 384, 4, 12, 8, 2, 2048, 2048, 104.70, 149.77]]
    assert "2205.01068" in opt["source"] and "§2.4" in opt["source"] and "opt_baselines.py" in opt["source"]
    assert opt["rows"] == [["OPT-175B", 992, 8, 124, 8, 992, 2048, 147]]
    assert "2410.06511" in titan["source"] and "llama3_h100_202412_torchtitan.md" in titan["source"]
    assert [row[13] for row in titan["rows"]] == [5762, 6667, 8532, 3890, 2540, 1071, 548, 5605, 6514, 8380, 829, 876]
    azure = data["deepspeed_azure_zero3"]
    assert "2022-07-26-deepspeed-azure.md" in azure["source"] and "examples_deepspeed/azure" in azure["source"]
    assert [(row[0], row[4], row[5], row[6], row[8]) for row in azure["rows"]] == [
        ("GPT 175B", 256, 32, 512, 204.49), ("GPT 1T", 1024, 8, 1024, 165.36), ("GPT 2T", 1024, 8, 1024, 157)]
    new = {"bloom_176b", "opt_175b", "deepspeed_azure_zero3", "torchtitan_h100"}
    assert not new & set(FITTED) and OTHER_PARTS == ("torchtitan_h100",)


def test_held_out_bloom_and_opt_rows(published):
    """BLOOM 176B's logged iteration (104.70 s at iteration 85,376, TP 4 PP 12 DP 8) is predicted
    9.2% short (95.1 s); OPT-175B's 'up to 147 TFLOP/s per GPU' (96-count) 12.7% over (165.7).
    Held out: these figures are what the model gives, held within half a point."""
    (bloom,) = [r for r in published if r["source"] == "bloom_176b"]
    (opt,) = [r for r in published if r["source"] == "opt_175b"]
    assert bloom["published"] == 104.70 and bloom["predicted"] / bloom["published"] - 1 == pytest.approx(-0.092, abs=0.005)
    assert opt["published"] == 147 and opt["predicted"] / opt["published"] - 1 == pytest.approx(0.127, abs=0.005)


def test_held_out_torchtitan_rows(published):
    """torchtitan's Llama 3.1 tables (H100 96GB HBM2e at 500 W), priced on the catalog's
    H100-SXM-96GB (2.4 TB/s of HBM2e, as the benchmark states; the SXM's peak FLOP/s): all 12 rows
    predicted too fast, 34.5% mean and 68.8% worst (8B at 262,144 tokens, CP 8) in docs/accuracy.md
    (38.8% and 69.6% at the H100 SXM's 3.35 TB/s); held within half a point."""
    e = errors(published, "torchtitan_h100")
    assert len(e) == 12 and np.all(e > 0.14)
    assert {r["gpu"] for r in published if r["source"] == "torchtitan_h100"} == {"H100-SXM-96GB"}
    assert np.abs(e).mean() == pytest.approx(0.345, abs=0.005) and np.abs(e).max() == pytest.approx(0.688, abs=0.005)


def test_pipeline_engine_is_deepspeeds_for_its_1f1b_schedule():
    """DeepSpeed's PipelineEngine runs only its TrainSchedule (1F1B): a deepspeed plan with more
    than one stage and 1F1B pays its blocking transfers (4 per micro-batch) and reduces the
    gradients after the schedule; Megatron's schedules, and a deepspeed plan asking for a
    schedule DeepSpeed lacks, pay 2 and keep the overlap the plan asks for."""
    from trainplan.estimate.pipeline import SCHEDULE_CODE
    from trainplan.estimate.pipeline_engine import engine_terms, pipeline_engine
    from trainplan.estimate.recipe import recipe
    from trainplan.plan import make_plan

    engine_of = {fw: recipe(make_plan(model="llama-3-8b", gpus=8, framework=fw)).pipeline_engine
                 for fw in ("deepspeed", "megatron", "fsdp", "fsdp1", "torch")}
    assert engine_of == {"deepspeed": "deepspeed", "megatron": "megatron", "fsdp": "megatron", "fsdp1": "megatron",
                         "torch": "megatron"}
    ds = pipeline_engine("deepspeed", 12, "1f1b")
    assert (ds.name, ds.p2p_transfers_per_micro_batch, ds.dp_reduction_overlapped) == ("deepspeed", 4.0, False)
    for name, pp, schedule in (("deepspeed", 1, "1f1b"), ("deepspeed", 16, "interleaved"), ("megatron", 12, "1f1b")):
        other = pipeline_engine(name, pp, schedule)
        assert (other.name, other.p2p_transfers_per_micro_batch, other.dp_reduction_overlapped) == ("megatron", 2.0, True)
    # array-friendly, as the layout search evaluates it: two more transfers and no overlap where
    # DeepSpeed's engine runs, nothing where it does not
    codes = np.array([SCHEDULE_CODE[s] for s in ("1f1b", "1f1b", "interleaved", "zb")])
    extra, overlap = engine_terms("deepspeed", np.array([1, 4, 4, 4]), codes, True)
    assert extra.tolist() == [0.0, 2.0, 0.0, 0.0] and overlap.tolist() == [True, False, True, True]
    extra, overlap = engine_terms("megatron", np.array([1, 4, 4, 4]), codes, True)
    assert extra.tolist() == [0.0] * 4 and overlap.tolist() == [True] * 4


def test_deepspeed_pipeline_engine_on_the_bloom_row():
    """On the BLOOM row, DeepSpeed's engine doubles each micro-batch's point-to-point seconds
    against Megatron's schedules (four blocking transfers against two) and exposes the
    gradient all-reduce: the step 2.0% longer (95.1 s against 93.2 s)."""
    import tomllib

    from trainplan.calibration import bloom_engine_comparison

    ds, mg = bloom_engine_comparison(tomllib.loads(DATA.read_text())["bloom_176b"])
    assert ds["micro_batch_s"]["pp_comm"] == pytest.approx(2 * mg["micro_batch_s"]["pp_comm"], rel=1e-9)
    assert ds["breakdown_s"]["dp_comm"] > mg["breakdown_s"]["dp_comm"]
    assert ds["breakdown_s"]["compute"] == pytest.approx(mg["breakdown_s"]["compute"], rel=1e-12)
    assert ds["step_s"] / mg["step_s"] - 1 == pytest.approx(0.020, abs=0.002)
    assert ds["step_s"] == pytest.approx(95.1, abs=0.1) and mg["step_s"] == pytest.approx(93.2, abs=0.1)


def test_held_out_deepspeed_zero3_azure_rows(published):
    """DeepSpeed's ZeRO-3 runs on Azure A100s (96-count TFLOP/s per GPU): 175B at 204.49 predicted
    1.4% under; 1T (165.36) and 2T (157), the optimizer on the CPU, 23.1% and 30.9% over; 18.5%
    mean in docs/accuracy.md (19.6% before each gather hid behind one unit's compute, submodule by
    submodule, at NCCL's ring latency over 1,024 ranks; 18.7% before NCCL's per-channel ceilings
    across nodes). Held out: held within half a point."""
    e = errors(published, "deepspeed_azure_zero3")
    assert e == pytest.approx([-0.014, 0.231, 0.309], abs=0.005)
