"""The bulk evaluation's sharing of work (the memory grid, the in-flight table, the step tables
of group pieces) is exact: a layout's figures do not depend on which other layouts are
evaluated with it, nor where a batch cuts, nor how the step table is cut; and the ranking is a
stable sort's first k."""


import numpy as np
import pytest

from trainplan.plan import load_model, make_plan
from trainplan.search import bulk, default_space, enumerate_layouts, evaluate_bulk, smallest

KEYS = ("peak_bytes", "fits", "step_s", "tokens_per_s", "mfu", "hfu")


@pytest.mark.parametrize("kw", [
    dict(model="mixtral-8x7b", gpus=32, gbs=128, framework="megatron"),  # expert parallelism free
    dict(model="deepseek-v3", gpus=256, gbs=512),  # dense, then MoE layers: stages of unequal weight
    dict(model="llama-3-70b", gpus=128, gbs=256, framework="fsdp", dp_shard=4),  # hybrid sharding
    dict(model="llama-3-8b", gpus=16, gbs=64, finetune="lora", lora_rank=64),  # stage 1 representative too
    dict(model="llama-3-70b", gpus=64, gbs=256, framework="deepspeed"),  # its own engine runs 1F1B
    dict(model="llama-3-8b", gpus=64, gbs=64, seq_len=32768),  # context parallelism free
])
def test_a_layouts_figures_do_not_depend_on_the_others_evaluated_with_it(kw):
    """The same figures, bit for bit, for every layout: evaluated all at once, in a shuffled
    order (runs and groups no longer adjacent: each layout its own), in batches cut inside
    groups of layouts that differ only in schedule, and alone (for a sample)."""
    plan = make_plan(**kw)
    model = load_model(plan)
    gpus = kw["gpus"]
    lay = enumerate_layouts(plan, default_space(plan, set(), gpus, model.layers, 8, model.is_moe), gpus, model)
    n = len(lay["tp"])
    whole = evaluate_bulk(plan, lay, gpus, model)
    assert 0 < whole["fits"].sum() < n  # layouts that fit and layouts that do not

    order = np.random.default_rng(3).permutation(n)
    shuffled = evaluate_bulk(plan, {k: v[order] for k, v in lay.items()}, gpus, model)
    cuts = [0, 1, 7, n // 3, n // 3 + 5, n - 2, n]  # batches of one, of a few, and the rest
    parts = [evaluate_bulk(plan, {k: v[a:b] for k, v in lay.items()}, gpus, model, fitting_only=True)
             for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    for key in KEYS:
        np.testing.assert_array_equal(shuffled[key], whole[key][order], err_msg=key)
        batched = np.concatenate([p[key] for p in parts])
        if key in ("peak_bytes", "fits"):
            np.testing.assert_array_equal(batched, whole[key], err_msg=key)
        else:  # fitting_only: the same where the layout fits
            np.testing.assert_array_equal(batched[whole["fits"]], whole[key][whole["fits"]], err_msg=key)
    for i in np.random.default_rng(4).choice(n, 5, replace=False):
        alone = evaluate_bulk(plan, {k: v[i:i + 1] for k, v in lay.items()}, gpus, model)
        for key in KEYS:
            assert alone[key][0] == whole[key][i] or (np.isnan(alone[key][0]) and np.isnan(whole[key][i])), key


@pytest.mark.parametrize("kw", [
    dict(model="llama-3-70b", gpus=256, gbs=512),  # groups of up to 14 schedules and interleavings
    dict(model="mixtral-8x7b", gpus=64, gbs=256, framework="torch"),  # torch's schedules, expert parallelism free
])
def test_the_step_tables_shape_changes_no_figure(kw, monkeypatch):
    """The same figures, bit for bit, whatever the step table's width (one layout a row, or a
    whole group) and however many parts it is worked out in (one, or a few rows each)."""
    plan = make_plan(**kw)
    model = load_model(plan)
    gpus = kw["gpus"]
    lay = enumerate_layouts(plan, default_space(plan, set(), gpus, model.layers, 8, model.is_moe), gpus, model)
    whole = evaluate_bulk(plan, lay, gpus, model)
    cell = bulk._grid(plan, lay, model).cell  # (a group's layouts share one)
    starts = np.flatnonzero(np.diff(cell, prepend=-1))
    assert np.diff(np.append(starts, len(cell))).max() > 3  # groups wider than a piece of 3
    for group_entries, step_entries in ((0, 7), (10**6, 1 << 14), (3, 50)):
        monkeypatch.setattr(bulk, "GROUP_ENTRIES", group_entries)
        monkeypatch.setattr(bulk, "STEP_ENTRIES", step_entries)
        other = evaluate_bulk(plan, lay, gpus, model)
        for key in KEYS:
            np.testing.assert_array_equal(other[key], whole[key], err_msg=f"{key} {group_entries} {step_entries}")


def test_no_layouts_evaluate_to_empty_figures():
    plan = make_plan(model="llama-3-8b", gpus=8)
    lay = enumerate_layouts(plan, default_space(plan, set(), 8, 32, 8, False), 8)
    out = evaluate_bulk(plan, {k: v[:0] for k, v in lay.items()}, 8)
    assert all(len(out[k]) == 0 for k in KEYS) and out["capacity_bytes"] > 0


def test_the_k_smallest_are_a_stable_sorts_first_k():
    """`smallest` (what `search` ranks with) against numpy's stable argsort: many equal keys,
    infinities, NaNs (last), k of none, some, all and more than all."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 60))
        key = rng.integers(0, 6, n).astype(float)  # many ties
        if trial % 3 == 0:
            key[rng.integers(0, n, 3)] = np.inf
        if trial % 5 == 0:
            key[rng.integers(0, n, 4)] = np.nan
        for k in (0, 1, 2, 5, n - 1, n, n + 3):
            np.testing.assert_array_equal(smallest(key, k), np.argsort(key, kind="stable")[:max(k, 0)],
                                          err_msg=f"{key} k={k}")
