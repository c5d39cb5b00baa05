"""More sharding never costs memory unless the framework truly spends it (docs/memory-model.md,
ZeRO and FSDP): under every framework convention a higher ZeRO stage needs no more memory than
a lower one, but for the buffers sharding itself allocates, which the plan names with their
source (memory.stages[].sharding_buffers, conventions.toml [sharding_buffers])."""

from __future__ import annotations

import numpy as np
import pytest

from trainplan.errors import PlanError
from trainplan.plan import conventions, make_plan, zero_stages
from trainplan.report import evaluate, to_json
from trainplan.search import Space, enumerate_layouts, evaluate_bulk, layout_plan
from trainplan.specs import catalog
from trainplan.units import GiB

FRAMEWORKS = ("deepspeed", "deepspeed-0.4", "megatron", "fsdp", "fsdp1", "torch")


def _layout_key(lay: dict, i: int) -> tuple:
    return tuple(int(lay[k][i]) for k in lay if k != "zero")


def _stage_totals(plan):
    """Per stage: the total, and the total less the sharding buffers (with their fragmentation)."""
    result = evaluate(plan, with_time=False)
    m = result.memory
    pp = result.layout.pp
    frag = plan.fragmentation if plan.fragmentation is not None else conventions()["runtime"]["fragmentation"]
    total = np.broadcast_to(np.asarray(m["total"], dtype=float), (pp,))
    buffers = sum(np.broadcast_to(np.asarray(v, dtype=float), (pp,)) for v in m["sharding_buffers"].values())
    return total, total - (1 + frag) * buffers, m


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_higher_zero_needs_no_more_memory_but_its_named_buffers(framework):
    """Every catalog model on 16 and 64 H100s over TP, PP (with interleaving), CP, EP and
    recompute, ZeRO 0 -> 1 -> 2 -> 3 (the stages the framework has): the bulk peaks never rise;
    where one does, the per-plan evaluation shows every stage's rise within the higher stage's
    sharding buffers (exact: the buffers' bytes and their fragmentation share)."""
    stages = list(zero_stages(framework))
    pairs = risen = 0
    for model in catalog.models():
        for gpus in (16, 64):
            plan = make_plan(model=model.name, gpu="H100-SXM", gpus=gpus, seq_len=4096, framework=framework)
            space = Space(tp=[1, 8], pp=[1, 2, 4], cp=[1, 2], ep=[1, 8] if model.is_moe else [1], zero=stages,
                          mbs=[1], recompute=["none", "full"], schedule=["1f1b", "interleaved"], vpp=[2])
            lay = enumerate_layouts(plan, space, gpus)
            if not lay or not len(lay["tp"]):
                continue
            peak = evaluate_bulk(plan, lay, gpus)["peak_bytes"]
            by_layout: dict[tuple, dict[int, int]] = {}
            for i in range(len(peak)):
                by_layout.setdefault(_layout_key(lay, i), {})[int(lay["zero"][i])] = i
            for zs in by_layout.values():
                order = sorted(zs)
                for lo, hi in zip(order, order[1:], strict=False):
                    pairs += 1
                    i, j = zs[lo], zs[hi]
                    if peak[j] <= peak[i]:
                        continue
                    risen += 1
                    try:
                        low, _, _ = _stage_totals(layout_plan(plan, lay, i, gpus))
                        _, high_less_buffers, _ = _stage_totals(layout_plan(plan, lay, j, gpus))
                    except PlanError:
                        continue
                    assert np.all(high_less_buffers <= low * (1 + 1e-12)), (
                        f"{model.name}, {framework}, {gpus} GPUs, {_layout_key(lay, j)}: ZeRO-{hi} needs "
                        f"{(high_less_buffers - low).max() / GiB:.3f} GiB more than ZeRO-{lo} beyond its sharding buffers")
    assert pairs > 1000, pairs  # the sweep compares what it says
    # a rise is the exception (a one-rank shard group, a gathered unit larger than the savings)
    assert risen < pairs / 10, (risen, pairs)


def test_fsdp_with_expert_parallelism_holds_its_gradients_once():
    """DeepSeek-V3 on 16 H100s, PP 2, EP 8, FSDP2: DP 8 leaves the experts one rank to shard
    over (torchtitan's expert mesh, dp_shard·cp / ep = 1). Under pipeline parallelism FSDP keeps
    the stage's bf16 parameters gathered (the named buffer) and accumulates the gradients
    unsharded in fp32, which the reduce-scatter at the last micro-batch replaces unit by unit
    with the shards: 4 bytes per trainable parameter, as replicated, not 4 + 4 / shard.
    (Before: 1,140 GiB at ZeRO-2 against 980 GiB at ZeRO-0.)"""
    base = dict(model="deepseek-v3", gpu="H100-SXM", gpus=16, pp=2, ep=8, framework="fsdp", seq_len=4096)
    t0, rest0, m0 = _stage_totals(make_plan(**base, zero=0))
    t2, rest2, m2 = _stage_totals(make_plan(**base, zero=2))
    trainable = np.asarray(m2["trainable_params"], dtype=float)
    assert np.asarray(m2["grads"]) == pytest.approx(trainable * 4, rel=1e-12)
    assert np.asarray(m0["grads"]) == pytest.approx(trainable * 4, rel=1e-12)
    gathered = np.asarray(m2["sharding_buffers"]["params_gathered"])
    assert gathered == pytest.approx(np.asarray(m2["param_count"], dtype=float) * 2, rel=1e-12)
    assert np.all(rest2 <= t0)
    # the peak's rise is the experts' bf16 copy less what sharding the dense part saves
    assert 0 < t2.max() - t0.max() < GiB
    data = to_json(evaluate(make_plan(**base, zero=2), with_time=False), with_max_mbs=False)["memory"]
    assert set(data["sharding_buffer_sources"]) == {"params_gathered", "grads_unsharded"}
    assert "torchtitan" in data["sharding_buffer_sources"]["params_gathered"]
    assert data["stages"][0]["sharding_buffers"]["params_gathered"] == pytest.approx(float(gathered[0]))


def test_fsdp1_with_one_rank_to_shard_over_runs_no_shard():
    """FSDP1 switches any strategy to NO_SHARD when its shard group is one rank
    (torch/distributed/fsdp/_init_utils.py): a TP 8 x PP 2 layout on 16 GPUs (DP 1) needs at
    SHARD_GRAD_OP and FULL_SHARD exactly what it needs at NO_SHARD (it was charged a gathered
    bf16 copy of the stage beside its unsharded parameters: 3.7 GiB more for Qwen3-30B-A3B)."""
    base = dict(model="qwen3-30b-a3b", gpu="H100-SXM", gpus=16, tp=8, pp=2, framework="fsdp1", seq_len=4096)
    totals = [_stage_totals(make_plan(**base, zero=z))[0] for z in (0, 2, 3)]
    assert totals[1] == pytest.approx(totals[0], rel=1e-12)
    assert totals[2] == pytest.approx(totals[0], rel=1e-12)
