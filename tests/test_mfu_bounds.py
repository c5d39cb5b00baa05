"""MFU and TFLOP/s are physical: no plan is credited with more FLOP/s than its accelerator's
peak (docs/time-model.md, MFU and TFLOP/s).

The model FLOPs count causal attention as the causal half the time model prices; an fp8 plan's
MFU divides by the fp8 peak. Every catalog model on every catalog accelerator over a spread of
layouts (CP to 16, sequences to 128K, fp8 where the accelerator has it, MoE with EP, PP with
schedules, every recompute and ZeRO stage) through the bulk evaluation search uses, and a
deterministic sample of them through `report.evaluate`."""

from __future__ import annotations

import numpy as np
import pytest

from trainplan.errors import PlanError
from trainplan.plan import make_plan
from trainplan.report import evaluate, to_json
from trainplan.search import Space, enumerate_layouts, evaluate_bulk, layout_plan
from trainplan.specs import catalog

GPUS = 64
SEQS = (4096, 131072)
SAMPLE_EVERY = 997  # the scalar path re-evaluates every 997th layout of each sweep (a prime: no aliasing)


def _precisions(gpu) -> list[str]:
    base = "bf16" if gpu.peak("bf16") else "fp16"
    return [base] + (["fp8"] if gpu.peak("fp8") else [])


def _sweeps(gpu):
    for model in catalog.models():
        for precision in _precisions(gpu):
            for seq in SEQS:
                yield model, precision, seq


def _plan(gpu, model, precision, seq):
    # an accelerator the catalog gives no link for gets one (100 Gb/s, 64 GB/s: slow links only
    # lower the MFU, the bound under test)
    links = {**({} if gpu.nic_gbps else {"nic_gbps": 100}), **({} if gpu.scale_up_gbs else {"scale_up_gbs": 64})}
    return make_plan(model=model.name, gpu=gpu.name, gpus=GPUS, seq_len=seq, precision=precision, **links)


def _space(model, zeros) -> Space:
    return Space(tp=[1, 8], pp=[1, 4], cp=[1, 16], ep=[1, 8] if model.is_moe else [1], zero=zeros, mbs=[1],
                 recompute=["none", "selective", "full"], schedule=["1f1b", "interleaved", "zb"], vpp=[2])


def _layouts(gpu):
    """(plan, layouts, model, precision, seq) of each sweep on `gpu` that has layouts."""
    from trainplan.plan import zero_stages

    for model, precision, seq in _sweeps(gpu):
        try:
            plan = _plan(gpu, model, precision, seq)
        except PlanError:
            continue  # a model whose positions or heads rule the sequence out
        lay = enumerate_layouts(plan, _space(model, list(zero_stages(plan.framework))), GPUS)
        if lay and len(lay["tp"]):
            yield plan, lay, model, precision, seq


# One case per accelerator (every catalog model on it), so that the sweep spreads over the test
# processes; what the whole sweep covers is counted below.
@pytest.mark.parametrize("gpu_name", [g.name for g in catalog.gpus()])
def test_every_catalog_plan_has_mfu_and_hfu_below_one(gpu_name):
    gpu = catalog.gpu(gpu_name)
    sampled = []
    for plan, lay, model, precision, seq in _layouts(gpu):
        res = evaluate_bulk(plan, lay, GPUS)
        mfu, hfu = res["mfu"], res["hfu"]
        where = f"{model.name} on {gpu.name} ({precision}, {seq} tokens)"
        assert len(mfu) == len(lay["tp"]), where
        assert np.all(np.isfinite(mfu)) and np.all(mfu > 0), where
        assert np.all(mfu < 1), f"{where}: MFU up to {mfu.max():.3f}"
        assert np.all(hfu >= mfu - 1e-12) and np.all(hfu < 1), f"{where}: HFU up to {hfu.max():.3f}"
        sampled += [(plan, lay, i, float(mfu[i])) for i in range(0, len(mfu), SAMPLE_EVERY)]

    # the per-plan path on a deterministic sample: the same MFU, TFLOP/s below the peak it names
    assert sampled
    for plan, lay, i, bulk_mfu in sampled:
        one = layout_plan(plan, lay, i, GPUS)
        t = evaluate(one).time
        peak = gpu.peak(t["mfu_peak"])
        assert t["mfu"] == pytest.approx(bulk_mfu, rel=1e-9)
        assert 0 < t["mfu"] <= t["hfu"] < 1
        assert 0 < t["tflops_per_gpu"] <= t["hardware_tflops_per_gpu"] < peak / 1e12
        assert t["tflops_per_gpu"] * 1e12 == pytest.approx(t["mfu"] * peak, rel=1e-12)


def test_the_sweep_covers_what_it_says():
    """Tens of thousands of layouts checked above (one evaluated per layout), fp8 and 128K with
    CP 16 among them, and over 50 of them through the per-plan path."""
    checked = fp8_plans = long_cp = sampled = 0
    for gpu in catalog.gpus():
        for _, lay, _, precision, seq in _layouts(gpu):
            n = len(lay["tp"])
            checked += n
            fp8_plans += n * (precision == "fp8")
            long_cp += int(np.sum(lay["cp"] == 16)) * (seq == 131072)
            sampled += len(range(0, n, SAMPLE_EVERY))
    assert checked > 50_000 and fp8_plans > 5_000 and long_cp > 1_000, (checked, fp8_plans, long_cp)
    assert sampled > 50


def test_llama_8b_at_128k_with_cp16_counts_causal_attention():
    """Llama 3.1 8B, 128 A100s, CP 16, 128K tokens, ZeRO-3: the full s² count (PaLM's
    12·L·H·Q·T, Megatron's) credited it with 329 TFLOP/s on a 312 TFLOP/s GPU. Model FLOPs per
    token, exactly: 3 x (2·N_linear + 2·h·V) for the GEMMs and the head (backward twice the
    forward), and 3.5 x the causal half of the attention's 2·s·(q + v) per layer (a fused
    backward is 2.5 forwards)."""
    plan = make_plan(model="llama-3.1-8b", gpu="A100-80GB-SXM", gpus=128, cp=16, seq_len=131072, zero=3)
    result = evaluate(plan)
    h, ffn, kv, L, V, s = 4096, 14336, 1024, 32, 128256, 131072
    linear = h * h + 2 * h * kv + h * h + 3 * h * ffn  # q, k, v, o, gate/up/down
    per_token = 3 * (2 * L * linear + 2 * h * V) + 3.5 * L * (2 * h + 2 * h) * s / 2
    tokens = result.layout.gbs * s
    t = result.time
    assert t["model_flops_per_step"] == pytest.approx(tokens * per_token, rel=1e-12)
    peak = 312e12  # A100 SXM dense bf16
    assert t["mfu_peak"] == "bf16" and t["mfu_fp8_peak"] is None
    assert t["mfu"] == pytest.approx(t["model_flops_per_step"] / (peak * t["step_s"] * 128), rel=1e-12)
    assert t["mfu"] < 1 and t["tflops_per_gpu"] < 312
    # counted over the full s² the same step would claim more than the peak
    full = tokens * (per_token + 3.5 * L * (2 * h + 2 * h) * s / 2)
    assert full / t["step_s"] / 128 > peak


def test_fp8_plan_names_its_peak():
    """An fp8 plan's GEMMs run at the fp8 peak (H20: 296 TFLOP/s dense, twice its 148 bf16):
    its MFU divides by it, and the JSON and the text give the MFU against both peaks."""
    plan = make_plan(model="llama-3.1-8b", gpu="H20", gpus=16, precision="fp8", recompute="full")
    data = to_json(evaluate(plan), with_max_mbs=False)
    t = data["time"]
    assert t["mfu_peak"] == "fp8"
    assert t["mfu"] == t["mfu_fp8_peak"]
    assert t["mfu_bf16_peak"] == pytest.approx(t["mfu"] * 296 / 148, rel=1e-12)
    assert 0 < t["mfu"] < 1 and t["tflops_per_gpu"] < 296
    from rich.console import Console

    from trainplan.render import render_time

    console = Console(record=True, width=200)
    render_time(console, data)
    assert f"MFU {t['mfu']:.1%} (HFU {t['hfu']:.1%}) of the fp8 peak, {t['mfu_bf16_peak']:.1%} of the bf16 peak" \
        in console.export_text()
    bf16 = to_json(evaluate(plan.model_copy(update={"precision": "bf16"})), with_max_mbs=False)["time"]
    assert bf16["mfu_peak"] == "bf16" and bf16["mfu"] == bf16["mfu_bf16_peak"]
    assert bf16["mfu_fp8_peak"] == pytest.approx(bf16["mfu"] / 2, rel=1e-12)
