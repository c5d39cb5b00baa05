"""In-flight micro-batches per stage and the per-stage layer split."""

import numpy as np
import pytest

from trainplan.estimate.pipeline import SCHEDULE_CODE, in_flight
from trainplan.plan import default_stage_split, make_plan, resolve


def test_1f1b_holds_p_minus_i():
    """PipeDream-Flush / 1F1B: stage i of p keeps p - i micro-batches (Narayanan et al. 2021)."""
    got = in_flight(SCHEDULE_CODE["1f1b"], np.arange(4), 4, 8)
    assert list(got) == [4, 3, 2, 1]
    # fewer micro-batches than stages: capped at m
    assert list(in_flight(SCHEDULE_CODE["1f1b"], np.arange(4), 4, 2)) == [2, 2, 2, 1]


def test_gpipe_holds_all_m():
    assert list(in_flight(SCHEDULE_CODE["gpipe"], np.arange(4), 4, 8)) == [8] * 4


def test_zero_bubble_h1_same_memory_as_1f1b():
    """ZB-H1 (Qi et al. 2024) keeps 1F1B's activation memory."""
    a = in_flight(SCHEDULE_CODE["zb"], np.arange(8), 8, 32)
    b = in_flight(SCHEDULE_CODE["1f1b"], np.arange(8), 8, 32)
    assert list(a) == list(b)


@pytest.mark.parametrize("p,v", [(4, 2), (8, 3), (35, 3)])
def test_interleaved_first_stage(p, v):
    """Korthikanti et al. 2023 §4.2.3: stage 0 holds (1 + (p-1)/(p·v)) x p micro-batches of
    its layers, from Megatron's warm-up count (p-1)·2 + (v-1)·p + 1 chunk-forwards."""
    got = float(in_flight(SCHEDULE_CODE["interleaved"], 0, p, 4 * p, v))
    assert got == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_llama3_405b_split_126_layers_on_16_stages():
    """Llama 3 (Dubey et al. 2024) §3.3.2: one layer fewer on the first and the last stage."""
    split = default_stage_split(126, 16)
    assert split == [7] + [8] * 14 + [7]
    lay = resolve(make_plan(model="llama-3.1-405b", gpus=16 * 8, tp=8, pp=16))
    assert lay.stage_layers == split


def test_uneven_split_properties():
    for layers in range(1, 70):
        for pp in range(1, min(layers, 17) + 1):
            split = default_stage_split(layers, pp)
            assert sum(split) == layers and min(split) >= 1 and max(split) - min(split) <= 1


def test_stage_layers_by_hand():
    lay = resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, stage_layers="6,9,9,8"))
    assert lay.stage_layers == [6, 9, 9, 8]


def test_peak_stage_is_first_under_1f1b():
    from trainplan.report import evaluate, to_json

    data = to_json(evaluate(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=8, gbs=256)))
    stages = data["memory"]["stages"]
    acts = [s["activations_bytes"] for s in stages]
    assert acts[0] == max(acts)
    assert data["memory"]["peak_bytes"] == max(s["total_bytes"] for s in stages)
