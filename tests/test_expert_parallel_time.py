"""Expert-parallel all-to-all across nodes (estimate/all_to_all.py) on DeepSeek-V3 and H800s:
what crosses the node leaves through each GPU's NIC, node-limited routing sends a token once
per destination node, and DeepSeek-V3's report (arXiv 2412.19437 §3.2.1: cross-node expert
parallelism gives "an inefficient computation-to-communication ratio of approximately 1:1")
bounds the share."""

import numpy as np
import pytest
from typer.testing import CliRunner

from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.estimate.all_to_all import copies_crossing, crossing_share
from trainplan.estimate.collectives import link, overlapped
from trainplan.estimate.hardware import hardware
from trainplan.estimate.time import step_derivation
from trainplan.plan import make_plan, resolve
from trainplan.search import search

H, TOP_K, SEQ = 7168, 8, 4096  # DeepSeek-V3: hidden 7168, 8 routed experts per token; 4K pre-training


def deepseek(ep, pp, **kw):
    """DeepSeek-V3 on 2,048 H800s (8 per node, one 400 Gb/s NIC each), one 4K sequence a micro-batch."""
    base = dict(model="deepseek-v3", gpu="H800-SXM", gpus=2048, tp=1, pp=pp, ep=ep, seq_len=SEQ,
                zero=2 if pp == 1 else 1, recompute="full" if pp == 1 else "none", precision="fp8",
                gbs=4096 if pp == 1 else 3840)
    return resolve(make_plan(**{**base, **kw}))


def one(x):
    return float(np.ravel(x)[0])


def ratio(layout):
    """An MoE layer's dispatch and combine, forward and backward, over its compute without recomputation."""
    det = step_derivation(layout)["detail"]
    layer = det["layer"]["moe"]
    return 4 * one(det["a2a"]) / (one(layer["total"]) - one(layer["recompute"]))


def test_crossing_share_is_one_minus_the_node_share_of_experts():
    """Uniform routing: 1 - 8/256 of the copies leave the node at EP 256 on 8-GPU nodes, none at
    EP 8; node-limited to 4 of 32 nodes, a token crosses to 4·(1 - 1/32) nodes, not 8·(31/32)."""
    assert crossing_share(256, 1, 8) == pytest.approx(31 / 32, rel=1e-12)
    assert crossing_share(8, 1, 8) == 0.0
    assert copies_crossing(256, 8.0, TOP_K) == pytest.approx(8 * 31 / 32, rel=1e-12)
    assert copies_crossing(256, 8.0, TOP_K, node_limit=4) == pytest.approx(4 * 31 / 32, rel=1e-12)


def test_dispatch_runs_on_each_gpus_nic():
    """EP 256 over 32 nodes: a dispatch moves 4096 tokens x 8 copies x 7168 x 2 B x 31/32 through
    the GPU's own NIC at 400 Gb/s x 0.90 (45 GB/s; DeepEP measures 43-58 GB/s per CX7 NIC), plus
    one call's latency: 10.1 ms; DeepSeek's 4-node limit halves it."""
    lay = deepseek(256, 1)
    hw = hardware(lay)
    assert hw.nic == pytest.approx(45e9)
    lat = link(hw, 3, 256, 1, 8)[1]
    expected = SEQ * TOP_K * H * 2 * 31 / 32 / hw.nic + lat
    assert one(step_derivation(lay)["detail"]["a2a"]) == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(10.1e-3, abs=0.1e-3)
    limited = one(step_derivation(deepseek(256, 1, ep_node_limit=4))["detail"]["a2a"])
    assert limited - lat == pytest.approx((expected - lat) / 2, rel=1e-9)


def test_all_to_all_is_about_one_to_one_with_compute():
    """DeepSeek-V3 §3.2.1: cross-node all-to-all about 1:1 with computation, under its routing
    (each token to at most 4 nodes). Its own layout (EP 64 over 8 nodes, PP 16) and EP 256 over
    32 nodes, node-limited, each within a factor 1.5 of 1:1; without the limit every copy
    crosses on its own, 8·31/32 transfers a token instead of 4·31/32: twice the ratio (within 2%,
    the calls' latency). Priced on NVLink bandwidth, as before, they were 0.47 of the compute
    at EP 256 and at EP 64."""
    assert 1 / 1.5 <= ratio(deepseek(64, 16, ep_node_limit=4)) <= 1.5
    limited, unlimited = ratio(deepseek(256, 1, ep_node_limit=4)), ratio(deepseek(256, 1))
    assert 1 / 1.5 <= limited <= 1.5
    assert unlimited == pytest.approx(2 * limited, rel=0.02)


def test_overlap_hides_the_all_to_all_behind_compute():
    """--ep-overlap (DualPipe): the layer's all-to-alls run beside another micro-batch's compute;
    shorter than it, they cost only the slowdown of the compute they overlap."""
    plain, hidden = (deepseek(64, 16, ep_node_limit=4, ep_overlap=o) for o in (False, True))
    det = step_derivation(hidden)["detail"]
    hw = hardware(hidden)
    comm, compute = 4 * one(det["a2a"]), one(det["layer"]["moe"]["total"])
    assert one(step_derivation(plain)["detail"]["ep_layer"]) == pytest.approx(comm, rel=1e-12)
    assert one(det["ep_layer"]) == pytest.approx(one(overlapped(comm, compute, hw.overlap_slowdown)), rel=1e-12)
    assert one(det["ep_layer"]) == pytest.approx(hw.overlap_slowdown * comm, rel=1e-12)


@pytest.mark.parametrize("kw,field", [
    (dict(model="llama-3-8b", gpus=8, ep_node_limit=2), "ep_node_limit"),
    (dict(model="deepseek-v3", gpu="H800-SXM", gpus=2048, ep=64, ep_node_limit=9), "ep_node_limit"),
    (dict(model="llama-3-8b", gpus=8, ep_overlap=True), "ep_overlap"),
    (dict(model="deepseek-v3", gpu="H800-SXM", gpus=2048, ep=64, gbs=2048, ep_overlap=True), "ep_overlap"),
])
def test_invalid_ep_options_are_refused_by_name(kw, field):
    with pytest.raises(PlanError) as exc:
        resolve(make_plan(**kw))
    assert exc.value.field == field
    res = CliRunner().invoke(app, ["plan", *(f"--{k.replace('_', '-')}={v}" if not isinstance(v, bool)
                                             else f"--{k.replace('_', '-')}" for k, v in kw.items())])
    assert res.exit_code == 2 and field in res.output


def test_search_leaves_the_unpipelined_ep_256_layout():
    """DeepSeek-V3 on 2,048 H800s: priced on NVLink bandwidth the search's best was no pipeline,
    EP 256 over 32 nodes, ZeRO-2, full recomputation; with the NICs priced and the all-to-alls
    exposed (NCCL's, under 1F1B) it pipelines and keeps the expert-parallel group inside a node.
    (Told DeepSeek's routing and overlap, --ep-node-limit 4 --ep-overlap, EP 256 without a
    pipeline is best again: its all-to-alls, 0.8 of the compute, hide behind it.)"""
    best = search(make_plan(model="deepseek-v3", gpu="H800-SXM", gpus=2048), set(), top=1)["best"][0]
    par = best["parallel"]
    assert par["pp"] > 1 and par["ep"] * par["tp"] * par["cp"] <= 8, par


def test_dualpipe_overlaps_the_all_to_all():
    """Under DualPipe (DeepSeek-V3 §3.2.1) the all-to-alls run beside the other micro-batch's
    compute whether or not --ep-overlap is given; under 1F1B they are exposed unless it is."""
    kw = dict(model="deepseek-v3", gpu="H800-SXM", gpus=2048, tp=1, pp=16, ep=64, zero=1, seq_len=SEQ, gbs=4096,
              ep_node_limit=4, precision="fp8")
    from trainplan.estimate.time import step_time

    def ep(schedule, overlap):
        return step_time(resolve(make_plan(**kw, schedule=schedule, ep_overlap=overlap)))["micro_batch_s"]["ep_comm"]

    assert ep("dualpipe", False) == pytest.approx(ep("dualpipe", True), rel=1e-12)
    slowdown = hardware(resolve(make_plan(**kw))).overlap_slowdown
    assert ep("1f1b", True) == pytest.approx(slowdown * ep("1f1b", False), rel=1e-9)
