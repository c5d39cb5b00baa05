"""The input pipeline (seed 004 §"data pipeline", eqs. 7-11 and Example 1.1) and in-network
all-reduce, inside the step time."""

import numpy as np
import pytest

from trainplan.estimate import comm
from trainplan.estimate.data import data_seconds, data_stage_seconds, step_with_data
from trainplan.plan import make_plan, resolve
from trainplan.report import evaluate


def test_seed_gpt2_pipeline_example():
    """Seed 004, Example 1.1: 32 x 1024 tokens per batch; one BPE worker at 500K tokens/s takes
    65.5 ms; the int64 batch (262.1 KB) crosses PCIe Gen3 x16 (15.75 GB/s) in 0.017 ms; with
    the ~0.1 ms read that is 65.6 ms of preparation, and a serial loader in front of an
    84.4 ms step leaves the accelerator busy about 56% of the time. Eight workers: 8.2 ms."""
    tokens = 32 * 1024
    one = data_stage_seconds(tokens, bytes_per_token=2.14, storage_gbs=0.70, workers=1, tokenize_rate=500e3,
                             h2d_gbs=15.75)
    assert one["tokenize"] * 1e3 == pytest.approx(65.5, abs=0.05)
    assert tokens * 8 / 1e3 == pytest.approx(262.1, abs=0.05)  # KB of int64 ids
    assert one["host_to_device"] * 1e3 == pytest.approx(0.017, abs=0.0005)
    assert one["storage"] * 1e3 == pytest.approx(0.1, abs=0.005)
    prep = data_seconds(one, prefetch=False)
    assert prep * 1e3 == pytest.approx(65.6, abs=0.1)
    step = step_with_data(0.0844, prep, prefetch=False)
    assert 0.0844 / step == pytest.approx(0.56, abs=0.005)
    eight = data_stage_seconds(tokens, bytes_per_token=2.14, storage_gbs=0.70, workers=8, tokenize_rate=500e3,
                               h2d_gbs=15.75)
    assert eight["tokenize"] * 1e3 == pytest.approx(8.2, abs=0.05)
    # prefetching overlaps the stages with each other and with the step: the accelerator waits for nothing
    assert step_with_data(0.0844, data_seconds(eight, prefetch=True), prefetch=True) == 0.0844


def test_a_slow_loader_sets_the_step_and_shows_in_the_breakdown():
    kw = dict(model="gpt2", gpu="A100-80GB-SXM", gpus=8, gbs=256, mbs=32, seq_len=1024)
    fast = evaluate(make_plan(**kw)).time
    assert fast["breakdown_s"]["data"] == 0.0  # pre-tokenized ids over PCIe: never the bottleneck
    slow_kw = dict(kw, tokenize_rate=50e3, data_workers=2)  # 32K tokens per rank, 100K tokens/s
    tokens_per_rank = 256 * 1024 / 8
    prefetched = evaluate(make_plan(**slow_kw)).time
    data = tokens_per_rank / 100e3  # tokenizing is the slowest input stage, and slower than the step
    assert data > fast["step_s"]
    assert prefetched["step_s"] == pytest.approx(data, rel=1e-12)
    assert prefetched["breakdown_s"]["data"] == pytest.approx(prefetched["step_s"] - fast["step_s"], rel=1e-9)
    stages = prefetched["input_pipeline_s"]
    assert stages["tokenize"] == pytest.approx(data, rel=1e-12) and stages["storage"] == 0.0
    assert stages["per_step_s"] == pytest.approx(data, rel=1e-12) and stages["prefetch"] is True
    serial = evaluate(make_plan(**slow_kw, prefetch=False)).time
    h2d = tokens_per_rank * 8 / 25e9
    assert serial["step_s"] == pytest.approx(fast["step_s"] + data + h2d, rel=1e-12)
    assert sum(serial["breakdown_s"].values()) == pytest.approx(serial["step_s"], rel=1e-12)


def test_storage_reads_raw_text_or_token_ids():
    """Raw text is read at ~4 bytes per token; pre-tokenized ids at 2 bytes (uint16) when the
    vocabulary fits, else 4 (Llama 3's 128K vocabulary)."""
    from trainplan.estimate.data import data_options
    from trainplan.plan import load_model

    for model, ids in (("gpt2", 2.0), ("llama-3-8b", 4.0)):
        plan = make_plan(model=model, storage_gbs=1.0)
        assert data_options(plan, load_model(plan))["bytes_per_token"] == ids
        plan = make_plan(model=model, storage_gbs=1.0, tokenize_rate=1e6)
        assert data_options(plan, load_model(plan))["bytes_per_token"] == 4.0


def test_in_network_all_reduce_halves_its_bus_traffic():
    """NVLS / SHARP reduce in the switch: an all-reduce moves (n-1)/n of the data per rank
    instead of a ring's 2(n-1)/n (nccl-tests PERFORMANCE.md); other collectives are unchanged."""
    assert comm.bus_factor(comm.ALL_REDUCE, 8, sharp=True) * 2 == comm.bus_factor(comm.ALL_REDUCE, 8)
    assert comm.bus_factor(comm.ALL_GATHER, 8, sharp=True) == comm.bus_factor(comm.ALL_GATHER, 8)
    kw = dict(model="llama-3-70b", gpu="H100-SXM", gpus=64, tp=8, pp=4, gbs=256, seq_len=8192, zero=1, sp=True)
    ring, nvls = evaluate(make_plan(**kw)).time, evaluate(make_plan(**kw, sharp=True)).time
    assert nvls["breakdown_s"]["tp_comm"] < 0.55 * ring["breakdown_s"]["tp_comm"]
    assert nvls["step_s"] < ring["step_s"]
    # the gradient all-reduce itself (the framework's own passes over the gradients beside it
    # stay as they are)
    from trainplan.estimate.time import step_derivation

    ddp = dict(model="llama-3-8b", gpu="H100-SXM", gpus=64, gbs=64, seq_len=2048, zero=0, overlap_dp=False)
    ring_ar, nvls_ar = (float(np.asarray(step_derivation(resolve(make_plan(**ddp, sharp=s)))["dp_collectives_s"]
                                         ["all_reduce"]).ravel()[0]) for s in (False, True))
    assert nvls_ar < 0.55 * ring_ar


@pytest.mark.parametrize("extra", [dict(tokenize_rate=2e5, data_workers=4), dict(tokenize_rate=2e5, prefetch=False),
                                   dict(sharp=True), dict(storage_gbs=0.05)])
def test_bulk_search_equals_plan_with_data_and_sharp(extra):
    from trainplan.plan import load_model
    from trainplan.search import default_space, enumerate_layouts, evaluate_bulk, layout_plan

    plan = make_plan(model="llama-3-8b", gpus=32, gbs=128, seq_len=4096, **extra)
    model = load_model(plan)
    lay = enumerate_layouts(plan, default_space(plan, set(), 32, model.layers, 8, False), 32)
    res = evaluate_bulk(plan, lay, 32)
    for i in np.random.default_rng(3).choice(len(lay["tp"]), 20, replace=False):
        one = evaluate(layout_plan(plan, lay, int(i), 32))
        assert one.time["step_s"] == pytest.approx(res["step_s"][i], rel=1e-12)
