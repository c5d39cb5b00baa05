"""One plan's fast paths give the figures of the general ones: the scalar answers of
estimate/scalars.py equal numpy's, the memoised per-layout figures (layer terms, layer times, the
recipe, the accelerator) equal freshly computed ones, a plan evaluated on scalars equals the same
layout evaluated as one entry of layout arrays (search's path), and a plan's JSON is the same
with every memo cleared as with every memo warm."""

import inspect
import json
import math
import re

import numpy as np
import pytest

from trainplan import report
from trainplan.estimate import (
    collectives,
    comm,
    data_parallel,
    memo,
    memory,
    micro_batch_limit,
    stage,
)
from trainplan.estimate import hardware as hardware_module
from trainplan.estimate import held as held_module
from trainplan.estimate import recipe as recipe_module
from trainplan.estimate import time as time_module
from trainplan.estimate.hardware import hardware
from trainplan.estimate.recipe import RECIPE_FIELDS, recipe
from trainplan.estimate.scalars import any_, bools, floats, maximum, minimum, values, where
from trainplan.estimate.stage import _layer_times, layer_times, stage_times
from trainplan.plan import make_plan, resolve
from trainplan.report import evaluate, to_json

# layouts over the model kinds and options the per-layer figures branch on
CASES = [
    dict(model="llama-2-70b", gpus=64, tp=8, pp=4, zero=1, sp=True, recompute="selective", gbs=128, seq_len=4096),
    dict(model="deepseek-v3", gpu="H800", gpus=2048, pp=16, ep=64, zero=1, gbs=4096, precision="fp8",
         framework="megatron", recompute="selective", recompute_modules="layernorm,mla_up_proj,moe_act",
         fp8_cache="attn_out,moe_act_input"),
    dict(model="llama-3-8b", gpus=8, zero=3, framework="fsdp", recompute="full", recompute_layers=4),
    dict(model="llama-3-8b", gpus=1, finetune="qlora", gpu="RTX-4090", recompute="full", lora_dropout=0.1),
    dict(model="mixtral-8x7b", gpus=32, tp=2, ep=8, pp=2, zero=1, framework="megatron", sp=True),
    dict(model="gpt2-xl", gpus=4, gpu="V100-SXM2-32GB", precision="fp16", attention="eager", dropout=0.1),
    dict(model="llama-3-8b", gpus=16, tp=2, cp=4, seq_len=65536, gbs=32, framework="megatron", sp=True,
         cp_comm="allgather"),
    dict(model="gemma-2-27b", gpus=32, tp=4, pp=2, gpu="TPU-v5p", optimizer="adafactor"),
    dict(model="llama-3.1-70b", gpus=128, tp=8, pp=8, schedule="dualpipev", gbs=256, framework="torch"),
]

SCALARS = [0, 1, 3, -2, 0.0, -0.0, 2.5, -1.5, True, False, np.float64(4.0), np.float64(-0.0), np.int64(7),
           np.bool_(True), float("inf"), float("nan")]


def _same(a, b) -> bool:
    """Equal value, NaN included, and the same sign of zero."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def test_scalar_answers_equal_numpys():
    """Every pair (and condition) of scalar kinds: the value numpy gives, NaN and -0.0 included
    (numpy's maximum and minimum return the second operand on a tie)."""
    for a in SCALARS:
        assert any_(a) == bool(np.any(a))
        assert _same(floats(a), np.asarray(a, dtype=float)) and type(floats(a)) is np.float64
        assert bool(bools(a)) == bool(np.asarray(a, dtype=bool)) and type(bools(a)) is np.bool_
        assert values(a) is a
        for b in SCALARS:
            assert _same(maximum(a, b), np.maximum(a, b)), (a, b)
            assert _same(minimum(a, b), np.minimum(a, b)), (a, b)
            for c in (True, False, np.bool_(False), 0, 1.0):
                assert _same(where(c, a, b), np.where(c, a, b)), (c, a, b)


def test_array_arguments_go_to_numpy():
    """Arrays get numpy's own result; a scalar condition picks an array only where numpy's
    result is that array's values in its shape and dtype."""
    x, y = np.array([1.0, -2.0, 3.0]), np.array([0.5, 4.0, 3.0])
    assert np.array_equal(maximum(x, y), np.maximum(x, y)) and np.array_equal(minimum(x, 2), np.minimum(x, 2))
    assert np.array_equal(where(x > 0, x, y), np.where(x > 0, x, y))
    for cond in (True, False):
        for a, b in ((x, y), (x, 2.0), (2.0, x), (x, y[:1]), (x.astype(int), 1.5), (x[None, :], y)):
            got, want = where(cond, a, b), np.where(cond, a, b)
            assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    assert bools(np.array([0, 2])).tolist() == [False, True] and floats([1, 2]).dtype == float
    assert any_(np.array([0.0, 1.0])) is True and any_(np.zeros(3)) is False


def _clear_memos():
    assert memo.clear_all() >= 8
    assert not (memory._LAYER_TERMS.values or held_module._HELD.values or micro_batch_limit._MBS_GRIDS or report._ACCURACY.values
                or recipe_module._RECIPES.values or hardware_module._HARDWARE.values
                or memory._MEMORY_AND_LINE.values or micro_batch_limit._MAX_MBS.entries or time_module._LAYOUT_STEP.values
                or time_module._LAYOUT_STAGES.values or report._STAGE_ROWS.entries)
    assert memory._schedule_inputs.cache_info().currsize == 0 and not stage._LAYER_TIMES.values


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: kw["model"])
def test_a_plans_json_is_the_same_cold_and_warm(kw):
    """Every memo cleared, then warm (twice): the same `plan --json` text."""
    _clear_memos()
    cold = json.dumps(to_json(evaluate(make_plan(**kw))), allow_nan=False)
    warm = [json.dumps(to_json(evaluate(make_plan(**kw))), allow_nan=False) for _ in range(2)]
    assert warm == [cold, cold]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: kw["model"])
def test_memoised_figures_equal_fresh_ones(kw):
    """The memoised recipe, accelerator, layer terms and layer times equal the ones computed
    afresh, and the memos hand out copies (or read-only arrays) callers cannot change."""
    plan = make_plan(**kw)
    layout = resolve(plan)
    r = recipe(plan)
    assert r == recipe_module._recipe(plan) and recipe(make_plan(**kw)) is r
    hw = hardware(layout)
    assert hw == hardware_module._hardware(layout, None) and hardware(resolve(make_plan(**kw))) is hw
    _clear_memos()
    dense = memory.estimate_memory(layout, r)["dense_layer_terms"]  # the plain (scalar) evaluation
    memory.estimate_memory_and_line(layout, r)  # ... and the one with the micro-batch line's columns
    def arguments(parts):  # a memo key's values back (an array: (shape, dtype, bytes); a dict: its items)
        return [np.frombuffer(v[2], dtype=v[1]).reshape(v[0]) if isinstance(v, tuple) and len(v) == 3
                and isinstance(v[1], str) else v for v in parts]

    assert memory._LAYER_TERMS.values
    for key, (terms, total) in memory._LAYER_TERMS.values.items():  # every entry against a fresh evaluation
        shape, moe, names, values = key[0], key[1], key[2], arguments(key[3:])
        args = {n: dict(v) if n in ("saves", "modules", "fp8_cache") and v is not None else v
                for n, v in zip(names, values, strict=True)}
        fresh, fresh_total = memory.layer_terms_and_sum(shape, moe, args)
        assert fresh.keys() == terms.keys()
        assert all(np.array_equal(fresh[k], terms[k]) for k in fresh) and np.array_equal(fresh_total, total)
    assert held_module._HELD.values
    for key, figures in held_module._HELD.values.items():  # the parameters' figures against a fresh evaluation
        mn, r_, *inputs = arguments(key)
        fresh = held_module._held(mn, r_, held_module.HeldInputs(*inputs))
        assert fresh.keys() == figures.keys() and all(np.array_equal(fresh[k], figures[k]) for k in fresh)
    dense["attn_norm"] = -1.0  # a caller's change stays its own
    assert memory.estimate_memory(layout, r)["dense_layer_terms"]["attn_norm"] != -1.0
    args = dict(tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, ep=layout.ep, mbs=layout.mbs,
                seq=layout.seq_len, recompute=1, eager=False, dropout=0.0, overlap_tp=False, gpn=8,
                vocab_padded=layout.vocab_padded)
    memo = layer_times(layout.model, hw, r, **args)
    fresh = _layer_times(layout.model, hw, r, *args.values(), False, False, False, None, 0, False, None)
    assert memo.keys() == fresh.keys()
    for k in memo:
        if isinstance(memo[k], dict):
            flat = lambda d: {(a, b): v for a, sub in d.items() for b, v in (sub.items() if isinstance(sub, dict) else [(None, sub)])}  # noqa: E731
            assert flat(memo[k]).keys() == flat(fresh[k]).keys()
            assert all(_same(x, flat(fresh[k])[j]) for j, x in flat(memo[k]).items()), k
        else:
            assert _same(memo[k], fresh[k]), k
    memo["layer"]["dense"]["total"] = -1.0
    assert layer_times(layout.model, hw, r, **args)["layer"]["dense"]["total"] != -1.0


def test_recipe_memo_keys_on_every_field_recipe_reads():
    """RECIPE_FIELDS names every plan field the recipe reads (from its source), and two plans
    that differ in one of them get their own recipes."""
    source = "".join(inspect.getsource(f) for f in (recipe_module._recipe, recipe_module._bytes_per_param,
                                                   recipe_module._loss_bytes))
    read = set(re.findall(r"\bplan\.(\w+)", source))
    assert read == set(RECIPE_FIELDS)
    for base, change in ((dict(), dict(framework="megatron")), (dict(), dict(optimizer="sgd")),
                         (dict(), dict(grad_clip=0.0)), (dict(framework="fsdp"), dict(dropout=0.1)),
                         (dict(), dict(fused_loss=True)), (dict(), dict(precision="fp32")),
                         (dict(), dict(reduce_dtype="fp32")), (dict(finetune="lora"), dict(lora_dropout=0.1))):
        first = make_plan(model="llama-3-8b", gpus=8, **base)
        other = make_plan(model="llama-3-8b", gpus=8, **base, **change)
        assert recipe(other) == recipe_module._recipe(other) != recipe(first), change


def test_stage_times_on_scalars_equal_one_entry_of_layout_arrays():
    """A plan's stage times (scalars, memoised) equal the same layout priced as the one entry of
    layout arrays, as search prices it, to the last bit."""
    for kw in CASES[:3] + CASES[4:6]:
        layout = resolve(make_plan(**kw))
        r, hw = recipe(layout.plan), hardware(layout)
        stages = np.arange(layout.pp)
        common = dict(pp=layout.pp, dp=layout.dp, cp=layout.cp, mbs=layout.mbs, seq=layout.seq_len,
                      recompute=1 if layout.plan.recompute == "selective" else 0, eager=False,
                      dropout=layout.plan.dropout, overlap_tp=False, gpn=8,
                      stage_dense=np.asarray(layout.stage_dense_layers, dtype=float),
                      stage_moe=np.asarray(layout.stage_moe_layers, dtype=float),
                      first=(stages == 0).astype(float), last=(stages == layout.pp - 1).astype(float),
                      total_dense=sum(layout.stage_dense_layers), total_moe=sum(layout.stage_moe_layers),
                      vocab_padded=layout.vocab_padded, sp=layout.sp)
        one = stage_times(layout.model, hw, r, tp=layout.tp, ep=layout.ep, **common)
        arrays = stage_times(layout.model, hw, r, tp=np.array([layout.tp]), ep=np.array([layout.ep]), **common)
        for key in ("slowest_s", "totals", "p2p"):
            assert np.array_equal(np.ravel(one[key]), np.ravel(arrays[key])), (kw["model"], key)
        for part, value in one["slowest_parts"].items():
            assert np.array_equal(np.ravel(value), np.ravel(arrays["slowest_parts"][part])), (kw["model"], part)


def test_a_rule_registered_later_is_not_hidden_by_the_memo():
    """The memoised schedule figures follow the in-flight rules registered after them (and
    their removal)."""
    from trainplan.estimate import pipeline

    layout = resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, gbs=32, framework="deepspeed"))
    before = memory.layout_inputs(layout)["in_flight_mb"].tolist()
    assert before == [4.0, 3.0, 2.0, 1.0]  # 1F1B: pp - stage (32 micro-batches)
    code = pipeline.register_schedule("1f1b", lambda stage, pp, m, v, n: m + 0 * stage, framework="deepspeed")
    try:
        assert memory.layout_inputs(layout)["in_flight_mb"].tolist() == [32.0] * 4
    finally:
        del pipeline.IN_FLIGHT_RULES[(code, "deepspeed")]
    assert memory.layout_inputs(layout)["in_flight_mb"].tolist() == before


def test_a_callers_changes_to_a_memoised_plan_stay_its_own():
    """A memoised plan's memory, step and stage rows come in dicts of the caller's own: changing
    them leaves the next plan alone, and stage rows follow a figure the caller replaced."""
    kw = CASES[0]
    want = to_json(evaluate(make_plan(**kw)))
    result = evaluate(make_plan(**kw))
    result.memory["activation_parts"]["layers"] = -1.0
    result.memory["params"] = result.memory["params"] * 2
    result.mbs_line["points"] = result.mbs_line["points"] * 0
    result.time["breakdown_s"]["compute"] = -1.0
    changed = to_json(result)
    assert [row["params_bytes"] for row in changed["memory"]["stages"]] == [
        2 * row["params_bytes"] for row in want["memory"]["stages"]]
    assert changed["memory"]["stages"][0]["components"]["activation_parts"]["layers"] == -1.0
    # no memory per micro-batch: the largest candidate, the 128 sequences over dp 2
    assert changed["memory"]["max_mbs"] == 64 and want["memory"]["max_mbs"] < 64
    changed["memory"]["stages"][0]["components"]["activation_parts"]["layers"] = -2.0
    assert to_json(evaluate(make_plan(**kw))) == want
    step = time_module.step_time(result.layout, None, None, result.recipe)
    flops = ("model_flops_per_step", "hardware_flops_per_step")
    assert {k: v for k, v in step.items() if k not in flops} == {k: v for k, v in want["time"].items()
                                                                  if k != "accuracy"}


def _same_figures(a: tuple, b: tuple) -> bool:
    return all(_same(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("gpu", ["H100", "A100-80GB", "H800", "RTX-4090", "TPU-v5p", "MI300X"])
def test_one_collective_equals_the_same_layout_among_many(gpu):
    """A plan's collective (one layout's numbers, memoised) gives the seconds, algorithm,
    protocol and latency NCCL's pricing gives the same layout among an array of them, as search
    prices it, to the last bit: every kind, group sizes in and across nodes, strides, sizes from
    zero bytes to 70 GB, SHARP and calls."""
    hw = hardware(resolve(make_plan(model="llama-3-8b", gpus=8, gpu=gpu)))
    grid = np.array([(n, stride, nbytes) for n in (1.0, 2.0, 3.0, 8.0, 16.0, 64.0, 1024.0, 16384.0)
                     for stride in (1.0, 2.0, 8.0, 16.0)
                     for nbytes in (0.0, 1.0, 4095.0, 65536.0, 2.0 ** 24 - 1, 3.3e7, 7e10)])
    for kind in range(5):
        for gpn, sharp, calls in ((8, False, 1.0), (4, True, 3.0), (8, True, 80.0)):
            many = collectives._collective(hw.nvlink, hw.nic, hw.nccl, kind, grid[:, 2], grid[:, 0], grid[:, 1],
                                           gpn, sharp, np.full(len(grid), calls))
            for i, (n, stride, nbytes) in enumerate(grid):
                one = collectives._one_collective.__wrapped__(hw.nvlink, hw.nic, hw.nccl, kind, nbytes, n, stride,
                                                              gpn, sharp, calls)
                assert _same_figures(one, tuple(np.broadcast_to(x, grid[:, 0].shape)[i] for x in many)), (kind, n)
                assert one[1] in range(len(comm.ALGORITHMS)) and one[2] in range(len(comm.PROTOCOLS))


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: kw["model"])
def test_a_plan_after_one_with_another_batch_is_the_same_as_cold(kw):
    """A plan that differs from the one before only in its global batch (the memoised stages,
    memory and stage rows answer part of it) prints what it prints cold."""
    base = make_plan(**kw)
    other = {**kw, "gbs": 2 * resolve(base).gbs}
    _clear_memos()
    cold = json.dumps(to_json(evaluate(make_plan(**other))), allow_nan=False)
    _clear_memos()
    to_json(evaluate(base))
    assert json.dumps(to_json(evaluate(make_plan(**other))), allow_nan=False) == cold


def test_the_candidate_sizes_are_every_divisor_in_order():
    """The micro-batch candidates come from the prime factors: every divisor of the batch per
    data-parallel rank, ascending, as trial division by every number gives them."""
    for q in [*range(1, 1500), 2 ** 20, 3 ** 12, 2 ** 7 * 3 ** 4 * 5 * 7, 999_983, 999_983 * 2, 4096 * 1009]:
        got = micro_batch_limit._divisors(q)
        want = [d for d in range(1, math.isqrt(q) + 1) if q % d == 0]
        want = sorted(set(want + [q // d for d in want]))
        assert got == want, q
    cands, m = micro_batch_limit._mbs_candidates(4096, 3 * 2 ** 13, 4, 1)
    assert cands.tolist() == [c for c in range(1, 4097) if 3 * 2 ** 13 % (4 * c) == 0]
    assert m.tolist() == [3 * 2 ** 13 // (4 * c) for c in cands.tolist()]


# layouts whose figures a new global batch changes in different places: micro-batches in flight
# below and above pp, interleaving, DualPipe, ZeRO-3's unit-by-unit collectives, DeepSpeed's engine
BATCHES = [
    (dict(model="llama-3-8b", gpus=8, pp=8), (8, 16, 24, 64, 8)),
    (dict(model="llama-2-70b", gpus=64, tp=8, pp=4, schedule="interleaved", vpp=5, framework="megatron"),
     (32, 64, 96, 32)),
    (dict(model="deepseek-v3", gpu="H800", gpus=1024, pp=8, ep=64, zero=1, schedule="dualpipe",
          framework="megatron"), (2048, 4096, 6144)),
    (dict(model="llama-2-70b", gpus=64, zero=3, framework="fsdp", recompute="full"), (64, 128, 192, 64)),
    (dict(model="llama-2-70b", gpus=64, tp=8, pp=2, zero=1, framework="deepspeed"), (8, 16, 64)),
]


@pytest.mark.parametrize("kw, batches", BATCHES, ids=lambda x: x["model"] if isinstance(x, dict) else "")
def test_plans_of_one_layout_and_other_batches_are_each_the_same_as_cold(kw, batches):
    """One layout at a run of global batches, one after another (its stages, data-parallel
    collectives, memory and largest micro-batch's lines answered from the plans before): each
    prints what it prints with every memo cleared first."""
    cold = {}
    for gbs in batches:
        _clear_memos()
        cold[gbs] = json.dumps(to_json(evaluate(make_plan(**kw, gbs=gbs))), allow_nan=False)
    _clear_memos()
    for gbs in batches:
        assert json.dumps(to_json(evaluate(make_plan(**kw, gbs=gbs))), allow_nan=False) == cold[gbs], gbs


def test_scalar_call_memoises_one_plans_numbers_only():
    """`memo.scalar_call` answers a repeated call on numbers from its memo (the value computed
    the first time) and computes a call with an array, or an unhashable argument, afresh,
    keeping nothing."""
    calls = []

    def fn(*args):
        calls.append(args)
        return {"sum": sum(np.sum(a) for a in args if a is not None and not isinstance(a, str))}

    cache = memo.Memo(8)
    first = memo.scalar_call(cache, fn, 1.0, np.float64(2.0), 3, "megatron", None)
    assert memo.scalar_call(cache, fn, 1.0, np.float64(2.0), 3, "megatron", None) is first and first == {"sum": 6.0}
    assert len(calls) == 1
    arrays = memo.scalar_call(cache, fn, np.array([1.0, 2.0]), 3)
    assert arrays == {"sum": 6.0} and len(calls) == 2 and len(cache.values) == 1
    assert memo.scalar_call(cache, lambda *a: len(a), [1.0], 2.0) == 2 and len(cache.values) == 1  # unhashable


def test_same_objects_answers_only_for_the_same_read_only_objects():
    """`memo.SameObjects` gives the value computed for the same objects again (a memoised plan's
    read-only arrays and numbers), and computes afresh for equal but other objects, for objects
    with a writeable array (not kept), and once a kept array has been made writeable."""
    calls = []

    def total(a, b):
        calls.append(1)
        return float(np.sum(a) + b)

    cache = memo.SameObjects(4)
    a, b = np.array([1.0, 2.0]), 3.5
    a.flags.writeable = False
    assert cache.get("k", (a, b), lambda: total(a, b)) == 6.5 and len(calls) == 1
    assert cache.get("k", (a, b), lambda: total(a, b)) == 6.5 and len(calls) == 1
    assert cache.get("other key", (a, b), lambda: total(a, b)) == 6.5 and len(calls) == 2
    same_values = a.copy()
    same_values.flags.writeable = False
    cache.get("k", (same_values, b), lambda: total(same_values, b))
    assert len(calls) == 3
    writeable = np.array([1.0, 2.0])
    cache.get("k", (writeable, b), lambda: total(writeable, b))
    cache.get("k", (writeable, b), lambda: total(writeable, b))
    assert len(calls) == 5 and len(cache.entries) == 3
    a.flags.writeable = True
    a[0] = 10.0
    assert cache.get("k", (a, b), lambda: total(a, b)) == 15.5 and len(calls) == 6


def test_a_plans_data_parallel_collectives_and_zero3_terms_equal_fresh_ones():
    """The memoised data-parallel collectives of a plan (scalars) equal those computed afresh,
    and the same layouts as arrays (search's path) give the same figures, to the last bit."""
    for kw in (CASES[2], dict(model="llama-2-70b", gpus=64, tp=4, zero=3, framework="deepspeed", recompute="full"),
               dict(model="llama-2-70b", gpus=64, zero=3, framework="fsdp", dp_shard=8)):
        layout = resolve(make_plan(**kw))
        r, hw = recipe(layout.plan), hardware(layout)
        args = dict(dp=np.float64(layout.dp), cp=np.float64(layout.cp), tp=np.float64(layout.tp),
                    zero=np.float64(layout.zero), gpn=8, trainable=7.0e9, sharp=False, dp_shard=layout.dp_shard,
                    stage_layers=np.float64(layout.model.layers / layout.pp),
                    modules_per_layer=collectives.modules_per_layer(layout.model, r))
        memoised = data_parallel.dp_collectives(hw, r, **args)
        assert data_parallel.dp_collectives(hw, r, **args) is memoised
        fresh = data_parallel._dp_collectives_of(hw, r, *args.values())
        many = data_parallel.dp_collectives(hw, r, **{**args, "dp": np.array([float(layout.dp)])})
        assert memoised.keys() == fresh.keys() == many.keys()
        for k in memoised:
            assert _same(memoised[k], fresh[k]) and _same(memoised[k], np.ravel(many[k])[0]), (kw, k)


def test_a_memoised_values_copy_has_dicts_of_its_own_at_every_level():
    """`memo.fresh_copy` of a value kept through `read_only` (whose dict entries it learns there)
    and of one that was not: equal dicts, new at every level, around the same read-only arrays;
    a change to the copy leaves the memoised value as it was."""
    arr = np.arange(3.0)
    kept = memo.read_only({"a": arr, "b": 1.5, "c": {"d": {"e": 2.0}, "f": arr}, "g": (arr, {"h": 1.0})})
    assert not arr.flags.writeable
    loose = {"a": np.ones(2), "c": {"d": {"e": 2.0}}}
    for value in (kept, loose):
        copy = memo.fresh_copy(value)
        assert copy == value if value is loose else copy.keys() == value.keys()
        assert copy is not value and copy["c"] is not value["c"] and copy["c"]["d"] is not value["c"]["d"]
        assert copy["a"] is value["a"] and copy["c"]["d"] == value["c"]["d"]
        copy["c"]["d"]["e"] = -1.0
        copy["c"]["x"] = {}
        assert value["c"]["d"]["e"] == 2.0 and "x" not in value["c"]
    assert memo.fresh_copy(kept)["g"] is kept["g"]  # (a tuple is shared, as before)


def test_scalar_call_lets_the_functions_own_type_error_through():
    """A TypeError raised by the memoised function itself is the caller's, raised once, not
    taken for an unhashable argument (which computes afresh)."""
    calls = []

    def fn(x):
        calls.append(x)
        raise TypeError("inside")

    with pytest.raises(TypeError, match="inside"):
        memo.scalar_call(memo.Memo(4), fn, 1.0)
    assert calls == [1.0]


def test_the_largest_micro_batchs_memo_keys_tell_stage_kinds_apart():
    """Two layouts alike but for their stages' kinds (an even and an uneven split) each get the
    largest micro-batch of their own kinds, cold and warm, and equal kinds the same number."""
    even = dict(model="llama-3-8b", gpus=32, pp=4, zero=1, recompute="selective", seq_len=2048, gbs=4096)
    uneven = {**even, "stage_layers": "12,8,6,6"}
    cold = {}
    for kw in (even, uneven):
        memo.clear_all()
        cold[kw.get("stage_layers")] = to_json(evaluate(make_plan(**kw)))["memory"]["max_mbs"]
    assert (cold[None], cold["12,8,6,6"]) == (4, 2)  # (the first stage's 12 layers hold the most)
    for kw in (even, uneven, even, uneven):
        assert to_json(evaluate(make_plan(**kw)))["memory"]["max_mbs"] == cold[kw.get("stage_layers")]
    line = evaluate(make_plan(**even)).mbs_line
    kinds, number = micro_batch_limit._line_kinds(line["stage_kinds"], 4)
    fresh = {k: np.array(v) for k, v in line["stage_kinds"].items()}  # equal, writeable, new objects
    assert micro_batch_limit._line_kinds(fresh, 4) == (kinds, number)


def test_the_padded_vocabulary_is_megatrons_for_a_plan_and_for_searchs_arrays():
    """Megatron pads the vocabulary to 128 x TP (--make-vocab-size-divisible-by 128): GPT-2's
    50,257 to 50,304 at TP 1 and 51,200 at TP 8 (Megatron-LM's GPT-2 runs), Llama 3's 128,256
    to 129,024 at TP 8; torchtitan leaves it as it is. A plan's layout and search's array of
    layouts read the same figures."""
    from trainplan.plan import padded_vocab

    assert [padded_vocab(50257, "megatron", tp) for tp in (1, 8)] == [50304, 51200]
    assert padded_vocab(128256, "megatron", 8) == 129024 and padded_vocab(128256, "fsdp", 8) == 128256
    assert list(padded_vocab(50257, "megatron", np.array([1, 2, 8]))) == [50304, 50432, 51200]
    assert list(padded_vocab(50257, "fsdp", np.array([1, 8]))) == [50257, 50257]
    lay = resolve(make_plan(model="llama-3-8b", gpus=8, tp=8, framework="megatron"))
    assert lay.vocab_padded == 129024


def test_hardware_memo_keys_on_every_field_the_accelerator_reads():
    """The accelerator's memo key names every plan and accelerator field `_hardware` and
    `efficiencies` read (from their source, comments aside), and two plans that differ in one of
    the plan's get their own accelerators (a host link of 7 GB/s, not the catalog's)."""
    code = "\n".join(line.split("#")[0] for f in (hardware_module._hardware, hardware_module.efficiencies)
                     for line in inspect.getsource(f).splitlines())
    read = set(re.findall(r"\b(?:layout\.)?(plan|gpu)\.(\w+)", code)) - {("gpu", "peak")}
    key = inspect.getsource(hardware_module.hardware).split("key = (", 1)[1].split(")\n", 1)[0]
    keyed = set(re.findall(r"\b(plan|gpu)\.(\w+)", key))
    assert read <= keyed | {("gpu", "peak_tflops")} and ("gpu", "peak_tflops") in keyed, read - keyed
    for change in (dict(h2d_gbs=7.0), dict(host_gbs=7.0), dict(attention="eager"), dict(precision="fp8")):
        first, other = (resolve(make_plan(model="llama-3-8b", gpus=8, **kw)) for kw in ({}, change))
        assert hardware(other) == hardware_module._hardware(other, None) != hardware(first), change
