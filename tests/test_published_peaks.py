"""Peak memory against published peaks: torchtitan's Llama 3.1 tables (benchmarks/data/
published_runs.toml [torchtitan_h100], held out), and the per-op selective checkpointing its
`selective` mode runs (activations.op_sac_saved)."""

import tomllib
from pathlib import Path

import numpy as np
import pytest

from trainplan.calibration import torchtitan_peaks
from trainplan.errors import PlanError
from trainplan.estimate import activations as act
from trainplan.estimate.flops import op_sac_recomputed
from trainplan.estimate.memory import estimate_memory, model_numbers
from trainplan.plan import make_plan, resolve
from trainplan.specs import catalog

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.toml"
PEAKS = {r["label"]: r for r in torchtitan_peaks(tomllib.loads(DATA.read_text())["torchtitan_h100"])}
# Known gaps, each stated in docs/accuracy.md: the Float8 rows (torchtitan 0.3 saves every float8
# matmul's output; the published runs are from December 2024 code) and the 70B TP 8 rows.
GAPS = ("Float8", "Table 4")


@pytest.mark.parametrize("label", sorted(PEAKS))
def test_torchtitan_published_peak_within_10_percent(label):
    row = PEAKS[label]
    if any(g in label for g in GAPS):
        pytest.xfail("a stated gap (docs/accuracy.md, torchtitan peak memory)")
    assert row["predicted"] == pytest.approx(row["published"], rel=0.10)


def test_gaps_are_still_gaps():
    """The rows left out above stay more than 10% off; when one comes within, move it in."""
    for label, row in PEAKS.items():
        if any(g in label for g in GAPS):
            assert abs(row["predicted"] / row["published"] - 1) > 0.10, label


def test_selective_op_keeps_the_block_input_sdpa_and_every_second_matmul():
    """Llama 3.1 8B, per token and layer in bf16: the block input (4,096), wq's output (4,096),
    wv's (1,024), w1's (14,336) and w2's (4,096) - the 1st, 3rd, 5th and 7th matmuls - and SDPA's
    output (4,096) with its fp32 log-sum-exp per head (32 x 4 bytes): 63,616 bytes."""
    model = catalog.model("llama-3.1-8b")
    shape = model_numbers(model).shape
    assert float(act.op_sac_saved(shape, tokens=1, tp=1, sp=0, act_bytes=2)) == 63_616
    # float8 matmuls are all kept: wk (1,024), wo (4,096) and w3 (14,336) too
    assert float(act.op_sac_saved(shape, tokens=1, tp=1, sp=0, act_bytes=2, low_precision_mm=1)) == \
        63_616 + 2 * (1024 + 4096 + 14336)
    # recomputed in the backward: wk, wo and w3, 2 FLOPs per multiply-add
    assert op_sac_recomputed(model) == 2 * 4096 * (1024 + 4096 + 14336)
    # a fused QKV projection is one matmul: GPT-NeoX-20B re-runs its output and down projections
    assert op_sac_recomputed(catalog.model("gpt-neox-20b")) == 2 * 6144 * (6144 + 24576)


def test_selective_op_plans_torchtitans_llama3_8b_run_against_megatrons_selective():
    """torchtitan's Table 1 run (8 GPUs, local batch 2, s 8,192) published at 82.4 GiB: per-op
    selective checkpointing plans it within 10%, Megatron's selective recompute (the attention
    core only) would put it at more than 1.5x."""
    kw = dict(model="llama-3.1-8b", gpu="H100-SXM", gpus=8, zero=3, framework="fsdp", mbs=2, gbs=16, seq_len=8192,
              attention="flash", reduce_dtype="fp32")
    peak = {rc: float(np.max(estimate_memory(resolve(make_plan(**kw, recompute=rc)))["total"])) / 2**30
            for rc in ("selective-op", "selective")}
    assert peak["selective-op"] == pytest.approx(82.4, rel=0.10)
    assert peak["selective"] > 1.5 * 82.4


@pytest.mark.parametrize("kw, words", [
    (dict(model="mixtral-8x7b"), "has experts"),
    (dict(model="deepseek-v3", gpus=64, ep=8), "has experts"),
    (dict(model="llama-3-8b", attention="eager"), "--attention flash"),
    (dict(model="llama-3-8b", finetune="lora"), "full training"),
])
def test_selective_op_refused_where_not_modelled(kw, words):
    with pytest.raises(PlanError) as e:
        resolve(make_plan(**{"gpus": 8, "recompute": "selective-op", **kw}))
    assert e.value.field == "recompute" and words in str(e.value)
